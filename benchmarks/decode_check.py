"""GPU smoke check of the static decode loop, short enough for one device call.

    timeout 230 python benchmarks/decode_check.py --out $OUT/decode_check.json
        [--paths static,static-cublas,static-flex,static-hf] [--batches 1,256] [--new-tokens 128]
        [--profile] [--host]

The 1.2 B Llama shape (24 x 2048, random bf16 weights), batches 1 and 256, 128 greedy new
tokens: for each path (gpu_bench.GEN_PATHS; "static" = the compiled Llama step, with
arenaflow.decode.kernels at batch 1, "static-cublas" = the same without them, "static-matmul" =
with the kernels' GEMVs but the grouped-product attention, "static-flex" =
the same with FlexAttention's decode attention (engine decode_attention flex), "static-hf" =
the path before it) tokens/s, ms per decode step and the share of the bandwidth bound, which
step ran (decoder_path: "... (fallback)" if compiling failed), and whether its greedy token ids
equal transformers' generate()'s on the same ragged prompts, with generate()'s wall time for the
same batch. One JSON line per row on stdout, all of them in --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from gpu_bench import build_model, generation, generation_line, run_header


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results")
    ap.add_argument("--root", default="/tmp/arenaflow-bench", help="scratch directory")
    ap.add_argument("--paths", default="static", help="gpu_bench.GEN_PATHS entries")
    ap.add_argument("--batches", default="1,256")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--profile", action="store_true", help="kernels per step (slower)")
    ap.add_argument(
        "--host", action="store_true", help="a third call under cProfile: the host's time"
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    batches = [int(b) for b in args.batches.split(",")]
    res = {**run_header(args), "generation": []}
    torch.cuda.empty_cache()
    model_dir, res["model"] = build_model(Path(args.root), args.layers, args.hidden)
    print(json.dumps({"phase": "model built", "s": time.perf_counter() - t0}), flush=True)
    for path in args.paths.split(","):
        # greedy throughout: one compiled graph serves the timing and the equality check
        res["generation"] += generation(
            model_dir,
            batches,
            args.new_tokens,
            128,
            res["ceilings"]["copy_bytes_per_s"],
            path,
            equal_batches=tuple(batches),
            profile=args.profile,
            temperature=0.0,
            host=args.host,
        )
        print(json.dumps({"phase": f"{path} done", "s": time.perf_counter() - t0}), flush=True)
    res["wall_s"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(res, indent=2))
    for g in res["generation"]:
        print(generation_line(g))


if __name__ == "__main__":
    main()
