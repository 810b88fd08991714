"""GPU benchmark of arenaflow's own training and generation paths against the device's limits.

    python benchmarks/gpu_bench.py --out bench.json [--layers 16 --hidden 2048]

Builds a ~1.1 B-parameter Llama-shaped model with random bf16 weights (throughput does not
depend on weight values), a synthetic corpus of fully-formed 2048-token rows with an sha256
manifest, then measures, in one run:
- ceilings: device-to-device copy bandwidth and a bf16 8192^3 matmul;
- training tokens/s through `python -m arenaflow.train` (DeepSpeed ZeRO-3, NCCL, 1 GPU) for
  LoRA (r=64, all linear layers) and full fine-tuning, and MFU = 6 N tokens/s / matmul peak
  (the usual convention; LoRA does ~2/3 of that arithmetic, reported as `mfu_lora_4n` too);
- generation tokens/s through arenaflow.sampling.generate at batch sizes 1..256 against the
  bandwidth bound: batch x copy bandwidth (bytes read + written per s, the memory system's
  total) / (weight bytes + KV-cache bytes read per decode step).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from arenaflow import chat, manifest, sampling, tinymodel


def ceilings() -> dict:
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    copy_bw = 2 * x.numel() * 10 / (time.perf_counter() - t)  # bytes read + written
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    flops = 2 * 8192**3 * 10 / (time.perf_counter() - t)
    del x, y, a
    torch.cuda.empty_cache()
    return {"copy_bytes_per_s": copy_bw, "bf16_matmul_flops": flops}


def build_model(root: Path, layers: int, hidden: int) -> tuple[Path, int]:
    from transformers import LlamaConfig, LlamaForCausalLM

    out = root / "model"
    cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=int(hidden * 2.75),
                      num_hidden_layers=layers, num_attention_heads=hidden // 128,
                      num_key_value_heads=max(1, hidden // 512), max_position_embeddings=4096,
                      tie_word_embeddings=False, torch_dtype="bfloat16")
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tinymodel.build_tokenizer().save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return out, n


def build_corpus(root: Path, rows: int, seq: int) -> Path:
    out = root / "corpus"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, size=rows * seq, dtype=np.int32)
    mask = np.tile(np.r_[np.zeros(seq // 8, np.int8), np.ones(seq - seq // 8, np.int8)], rows)
    np.savez(out / "sft.npz", input_ids=ids, loss_mask=mask, offsets=np.arange(0, rows * seq + 1, seq))
    manifest.write(out, params={"synthetic": True, "rows": rows, "seq": seq})
    return out


def train(root: Path, model: Path, corpus: Path, method: str, steps: int, micro: int, seq: int,
          threshold: int) -> dict:
    hyper = {"method": method, "lora": {"r": 64, "alpha": 128, "dropout": 0.0, "target_modules": [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]},
        "lr": 1e-5, "weight_decay": 0.0, "warmup_ratio": 0.0, "min_lr_ratio": 0.1, "max_grad_norm": 1.0,
        "epochs": 1, "max_steps": steps, "micro_batch_size": micro, "grad_accum": 1, "seq_len": seq, "seed": 0,
        "zero3_persistence_threshold": threshold}
    out = root / f"runs/{method}-{threshold}/final"
    t = time.time()
    proc = subprocess.run([sys.executable, "-m", "arenaflow.train", "--arm", method, "--params-json",
                           json.dumps(hyper), "--corpus", str(corpus), "--init", "base",
                           "--base-model", str(model), "--out", str(out)],
                          capture_output=True, text=True)
    if proc.returncode:
        return {"error": proc.stderr[-3000:]}
    m = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    skip = 3  # the first steps include allocator warm-up
    tok = m[-1]["tokens_seen"] - m[skip - 1]["tokens_seen"]
    dt = m[-1]["elapsed_s"] - m[skip - 1]["elapsed_s"]
    return {"tokens_per_s": tok / dt, "steps_timed": len(m) - skip, "wall_s": time.time() - t,
            "peak_note": "see stderr tail", "final_loss": m[-1]["loss"]}


@torch.no_grad()
def generation(model_dir: Path, batches: list[int], new_tokens: int, prompt_len: int, bw: float,
               cache: str | None = None) -> list[dict]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    tok = tinymodel.build_tokenizer()
    cfg = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2
    prompt = chat.render([{"role": "user", "content": "x" * (prompt_len - 20)}], True)
    rows = []
    for bs in batches:
        dec = sampling.Decoding(temperature=1.0, max_new_tokens=new_tokens)
        # no stop token can end a row early: every row decodes new_tokens tokens
        model.generation_config.eos_token_id = None
        torch.cuda.synchronize()
        t = time.perf_counter()
        outs = sampling.generate(model, tok, [prompt] * bs, dec, k=1, seed=0, batch_size=bs, desc=f"bs{bs}",
                                 cache_implementation=cache)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        made = sum(o[0]["n_tokens"] for o in outs)
        ctx = prompt_len + new_tokens / 2  # mean context length during decoding
        bound = bs * bw / (weight_bytes + bs * ctx * kv_per_token)
        rows.append({"batch": bs, "cache": cache or "dynamic", "tokens_per_s": made / dt, "bound_tokens_per_s": bound,
                     "fraction_of_bound": made / dt / bound})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results")
    ap.add_argument("--root", default="/tmp/arenaflow-bench", help="scratch directory")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--gen-batches", default="1,16,64,256")
    ap.add_argument("--thresholds", default="0,100000", help="ZeRO-3 persistence thresholds to compare")
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args()
    root = Path(args.root)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args),
           "code": manifest.code_version()}
    res["ceilings"] = c = ceilings()
    model, n = build_model(root, args.layers, args.hidden)
    res["parameters"] = n
    corpus = build_corpus(root, rows=args.steps * args.micro + 8, seq=args.seq)
    runs = [(m, t) for m in ("lora", "full") for t in map(int, args.thresholds.split(","))]
    for method, threshold in runs:
        r = train(root, model, corpus, method, args.steps, args.micro, args.seq, threshold)
        if "tokens_per_s" in r:
            r["mfu_6n"] = 6 * n * r["tokens_per_s"] / c["bf16_matmul_flops"]
            r["mfu_lora_4n"] = 4 * n * r["tokens_per_s"] / c["bf16_matmul_flops"]
        res[f"train_{method}_t{threshold}"] = r
        print(method, threshold, json.dumps(r)[:400], flush=True)
    res["generation"] = []
    for cache in (None, "static"):
        res["generation"] += generation(model, [int(b) for b in args.gen_batches.split(",")],
                                        args.new_tokens, 128, c["copy_bytes_per_s"], cache)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"device {res['device']}: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"bf16 matmul {c['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s, model {n / 1e9:.2f} B")
    for m, t in runs:
        r = res[f"train_{m}_t{t}"]
        if "tokens_per_s" in r:
            print(f"train {m:4s} persistence {t:>7}: {r['tokens_per_s']:9.0f} tok/s  MFU(6N) {r['mfu_6n']:.1%}")
        else:
            print(f"train {m} persistence {t}: FAILED {r['error'][-600:]}")
    for g in res["generation"]:
        print(f"generate {g['cache']:7s} bs {g['batch']:4d}: {g['tokens_per_s']:9.0f} tok/s = "
              f"{g['fraction_of_bound']:.1%} of the bandwidth bound {g['bound_tokens_per_s']:.0f}")


if __name__ == "__main__":
    main()
