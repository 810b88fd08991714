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
# vLLM applies LoRA to every linear layer (vllm/lora/utils.py get_supported_lora_modules) and to
# the model class's `embedding_modules`: embed_tokens and lm_head on LlamaForCausalLM
# (model_executor/models/llama.py) and Qwen3ForCausalLM (qwen3.py); none on
# MistralForCausalLM ("We don't support LoRA on the embedding layers", mistral.py), Qwen2 or
# Gemma2. PEFT's q/k/v_proj and gate/up_proj load into the fused qkv_proj and gate_up_proj
# through each class's packed_modules_mapping (lora/worker_manager.py _load_adapter).
VLLM_EMBEDDINGS = ["embed_tokens", "lm_head"]
VLLM_SRC = "https://github.com/vllm-project/vllm/blob/v0.26.0/vllm"
TGI_SRC = "https://github.com/huggingface/text-generation-inference/blob/v3.3.7"

ENGINES = {
    "vllm": {
        "version": "vLLM 0.26.0",
        "docs": {
            "lora": f"{VLLM_SRC}/lora/utils.py",
            "args": f"{VLLM_SRC}/config/lora.py",
            "peft_helper": f"{VLLM_SRC}/lora/peft_helper.py",
            "added_tokens": f"{VLLM_SRC}/lora/lora_model.py",
            "patterns": f"{VLLM_SRC}/lora/lora_weights.py",
            "lora_dtypes": f"{VLLM_SRC}/lora/ops/triton_ops/lora_shrink_op.py",
            "flags": f"{VLLM_SRC}/engine/arg_utils.py",
        },
        # config/lora.py: MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512], the
        # --max-lora-rank choices; peft_helper.py validate_legal refuses r above the one given
        "max_lora_rank_choices": [1, 8, 16, 32, 64, 128, 256, 320, 512],
        # peft_helper.py _validate_features: "vLLM only supports modules_to_save being None."
        # and "vLLM does not yet support DoRA."; validate_legal: "Adapter bias is not supported."
        # (open: vllm-project/vllm#32599)
        "modules_to_save": False,
        "dora": False,
        "bias": False,
        # lora_model.py from_lora_tensors: "The embedding LoRA size(...) must be consistent with
        # the base model's vocabulary size(...)": an adapter shares the base's vocabulary (its
        # own added vocabulary, lora_extra_vocab_size, went in vllm-project/vllm#28382, #28545)
        "added_tokens": False,
        # PEFTHelper keeps r and lora_alpha only (rank_pattern/alpha_pattern are dropped by
        # from_dict), and lora_weights.py LoRALayerWeights.from_config gives every module that
        # one rank and scaling: a module PEFT scales otherwise would be served wrong
        "per_module_scaling": False,
        "lora_targets": {
            **{arch: LLAMA_LINEARS for arch in LLAMA_LIKE},
            "LlamaForCausalLM": LLAMA_LINEARS + VLLM_EMBEDDINGS,
            "Qwen3ForCausalLM": LLAMA_LINEARS + VLLM_EMBEDDINGS,
        },
        # --dtype: config/model.py ModelDType
        "dtypes": ["auto", "half", "float16", "bfloat16", "float", "float32"],
        # with LoRA, on CUDA (the Triton kernels, lora/ops/triton_ops/lora_shrink_op.py):
        # "assert inputs.dtype in [torch.float16, torch.bfloat16]", the LoRA weights in the
        # model's dtype (config/lora.py lora_dtype "auto"); --dtype auto downcasts a float32
        # model (config/model.py _resolve_auto_dtype)
        "lora_dtypes": ["auto", "half", "float16", "bfloat16"],
        # entrypoints/cli/serve.py: `vllm serve [model_tag] [options]`
        "launcher": ["vllm", "serve"],
        # engine/arg_utils.py add_cli_args (--enable-lora, --max-loras, --max-lora-rank,
        # --dtype, --max-model-len, --served-model-name, --generation-config: a folder holding
        # generation_config.json) and entrypoints/openai/cli_args.py (--lora-modules name=path,
        # --chat-template: a file)
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
        # the pages below are SGLang's current (unversioned) docs, read for 0.5. Later sources
        # (python/sglang/srt/lora/lora_config.py) read an adapter's added_tokens.json and
        # rank_pattern/alpha_pattern; no release is pinned here, so both stay unsupported and
        # such an adapter is served from merged/, which is right on any release
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
        "bias": False,
        "added_tokens": False,
        "per_module_scaling": False,
        "lora_targets": {arch: LLAMA_LINEARS for arch in LLAMA_LIKE},
        "dtypes": ["auto", "half", "float16", "bfloat16", "float", "float32"],
        "lora_dtypes": None,  # not documented: the model's --dtype
        "launcher": ["python", "-m", "sglang.launch_server"],
        # the LoRA page (--enable-lora, --lora-paths NAME=PATH, --max-lora-rank,
        # --lora-target-modules, --max-loras-per-batch) and the server arguments page
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
        "version": "text-generation-inference 3.3.7",
        "docs": {
            "lora": "https://huggingface.co/docs/text-generation-inference/conceptual/lora",
            "args": "https://huggingface.co/docs/text-generation-inference/reference/launcher",
            "adapters": f"{TGI_SRC}/server/text_generation_server/adapters/lora.py",
            "launcher": f"{TGI_SRC}/launcher/src/main.rs",
        },
        "max_lora_rank_choices": None,  # the launcher documents no rank limit
        # adapters/lora.py: LoraConfig.load keeps r, lora_alpha, target_modules, fan_in_fan_out
        # and use_rslora (one scaling for every module: no rank_pattern/alpha_pattern), and
        # map_weights_for_model reads each module's lora_A/lora_B only (no modules_to_save, no
        # DoRA magnitude, no bias, no embedding)
        "modules_to_save": False,
        "dora": False,
        "bias": False,
        "added_tokens": False,
        "per_module_scaling": False,
        # models/flash_causal_lm.py ADAPTER_LAYERS
        "lora_targets": {arch: LLAMA_LINEARS for arch in LLAMA_LIKE},
        "dtypes": ["float16", "bfloat16"],  # launcher/src/main.rs enum Dtype: no float32
        "lora_dtypes": None,  # as --dtype
        "launcher": ["text-generation-launcher"],
        # launcher/src/main.rs struct Args (--lora-adapters: ids or name=path, the LoRA page)
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
