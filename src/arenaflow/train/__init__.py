"""Train one arm: LoRA or full fine-tuning, SFT or preferences (DPO, SimPO), on DeepSpeed ZeRO
(stage 3 across ranks, 2 on one: loop.zero_stage).

    python -m arenaflow.train --arm B3 --params-json '{...}' --corpus corpora/rft_r3 \\
        --init runs/R2d/final --base-model models/tiny-arith --out runs/B3/final
    torchrun --standalone --nproc_per_node 2 -m arenaflow.train ...   # N ranks, same command

Output (written atomically by rank 0): the adapter (adapter_model.safetensors +
adapter_config.json) or full weights, training_evidence.json, metrics.jsonl, manifest.json.
The corpus manifest is verified before anything is loaded.
"""
