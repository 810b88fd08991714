"""What the serving engines (vLLM, SGLang, TGI) accept of a model: their documented LoRA limits
and launch flags (limits), and the verdict on an adapter (fit). Data and checks only, below both
readers: arenaflow.bundles writes the verdicts into a bundle's serving config, and
arenaflow.decode.vllm_engine asks them of a policy's adapter before serving it."""
