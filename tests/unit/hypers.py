"""The LoRA hyperparameters of the unit tests' short trainings, in one place."""

# A LoRA run of a couple of steps: enough to write an adapter, metrics and a log to test
TINY_LORA = {
    "method": "lora",
    "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
    "lr": 5e-3,
    "weight_decay": 0.0,
    "warmup_ratio": 0.0,
    "min_lr_ratio": 0.1,
    "max_grad_norm": 1.0,
    "epochs": 1,
    "max_steps": 2,
    "micro_batch_size": 2,
    "grad_accum": 1,
    "seq_len": 256,
    "seed": 0,
}

# the same as a whole arm's hyper block, over every step of its corpus
TINY_ARM = {
    **{k: v for k, v in TINY_LORA.items() if k != "max_steps"},
    "micro_batch_size": 4,
    "nproc": 1,
    "runtime_min": 5,
    "mem_mb": 1000,
    "checkpoint_every": 0,
}
