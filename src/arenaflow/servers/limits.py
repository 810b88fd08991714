"""What vLLM, SGLang and TGI accept of a LoRA adapter, and the flags of their launch commands.

Data only, each limit with the page or source file that states it (as of the version named);
arenaflow.servers.fit checks adapters against it. A limit a page does not state is None (not
checked), and an adapter feature no page documents as supported is treated as unsupported:
serving then needs the merged weights, which every engine loads as a plain model.
"""

from __future__ import annotations

# The modules each engine applies LoRA to in a Llama-style decoder (q/k/v/o and the SwiGLU MLP;
# the engines fuse q/k/v and gate/up internally and map PEFT's names onto the fused layers).
LLAMA_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LLAMA_LIKE = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma2ForCausalLM",
]

ENGINES = {
    "vllm": {
        "version": "vLLM 0.12",
        "docs": {
            "lora": "https://docs.vllm.ai/en/latest/features/lora.html",
            "args": "https://docs.vllm.ai/en/latest/configuration/engine_args.html",
            "peft_helper": "https://github.com/vllm-project/vllm/blob/main/vllm/lora/peft_helper.py",
            "added_tokens": "https://github.com/vllm-project/vllm/pull/28545",
        },
        # engine args: --max-lora-rank {1,8,16,32,64,128,256,320,512}
        "max_lora_rank_choices": [1, 8, 16, 32, 64, 128, 256, 320, 512],
        # vllm/lora/peft_helper.py _validate_features: "vLLM only supports modules_to_save being
        # None." (and "vLLM does not yet support DoRA."); open: vllm-project/vllm#32599
        "modules_to_save": False,
        "dora": False,
        # lora_extra_vocab_size and every adapter's own added vocabulary were removed in Nov 2025
        # (vllm-project/vllm#28382, #28545): an adapter shares the base's vocabulary
        "added_tokens": False,
        "lora_targets": {arch: LLAMA_LINEARS for arch in LLAMA_LIKE},
        "dtypes": ["auto", "half", "float16", "bfloat16", "float", "float32"],
        "launcher": ["vllm", "serve"],
        "flags": [
            "--enable-lora",
            "--lora-modules",
            "--max-lora-rank",
            "--max-loras",
            "--chat-template",
            "--generation-config",
            "--dtype",
            "--served-model-name",
            "--max-model-len",
        ],
    },
    "sglang": {
        "version": "SGLang 0.5",
        "docs": {
            "lora": "https://docs.sglang.io/advanced_features/lora.html",
            "args": "https://docs.sglang.io/advanced_features/server_arguments.html",
        },
        # --max-lora-rank: "if not specified, inferred from the adapters in --lora-paths"; no
        # upper bound is documented
        "max_lora_rank_choices": None,
        # the LoRA page documents lora_A/lora_B adapters on --lora-target-modules only
        "modules_to_save": False,
        "dora": False,
        "added_tokens": False,
        "lora_targets": {arch: LLAMA_LINEARS for arch in LLAMA_LIKE},
        "dtypes": ["auto", "half", "float16", "bfloat16", "float", "float32"],
        "launcher": ["python", "-m", "sglang.launch_server"],
        "flags": [
            "--model-path",
            "--enable-lora",
            "--lora-paths",
            "--max-lora-rank",
            "--lora-target-modules",
            "--max-loras-per-batch",
            "--chat-template",
            "--dtype",
            "--served-model-name",
            "--context-length",
        ],
    },
    "tgi": {
        "version": "text-generation-inference 3.3",
        "docs": {
            "lora": "https://huggingface.co/docs/text-generation-inference/conceptual/lora",
            "args": "https://huggingface.co/docs/text-generation-inference/reference/launcher",
        },
        "max_lora_rank_choices": None,  # the launcher documents no rank limit
        # adapters are loaded per target module (lora_A/lora_B); no modules_to_save support is
        # documented
        "modules_to_save": False,
        "dora": False,
        "added_tokens": False,
        "lora_targets": {arch: LLAMA_LINEARS for arch in LLAMA_LIKE},
        "dtypes": ["float16", "bfloat16"],  # --dtype: no float32
        "launcher": ["text-generation-launcher"],
        "flags": [
            "--model-id",
            "--lora-adapters",
            "--tokenizer-config-path",
            "--dtype",
            "--max-input-tokens",
            "--max-total-tokens",
        ],
    },
}
