"""Candidate sampling throughput on the embedded default, as the candidates stage runs it.

    python benchmarks/sampling_cpu.py [--prompts 200 --k 4 --batch-sizes 16,64,256]

Samples k answers per prompt at T=0.8 from models/tiny-arith with arenaflow.decode.sampling.generate
(the same call `python -m arenaflow.candidates sample` makes), once per batch size, and prints
samples/s and tokens/s for each, and the ratio to the smallest batch, measured in this one run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from arenaflow import chat, models
from arenaflow.bases import tinymodel
from arenaflow.decode import sampling
from arenaflow.pools import math as mathpool

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch-sizes", default="16,64,256", help="sequences per generate() call")
    ap.add_argument("--out", default=None, help="optional JSON results")
    args = ap.parse_args()
    model, tok = models.load_policy(REPO / "models/tiny-arith", None)
    rows = mathpool.generate(args.prompts, 0, "train", {c: 1 for c in mathpool.CATEGORIES}, "bench")
    prompts = [
        chat.render(chat.prompt_messages(tinymodel.SYSTEM_PROMPT, r["prompt"]), True) for r in rows
    ]
    dec = sampling.Decoding(temperature=0.8, max_new_tokens=48)
    results = []
    for bs in map(int, args.batch_sizes.split(",")):
        t = time.perf_counter()
        outs = sampling.generate(
            model, tok, prompts, dec, k=args.k, seed=0, batch_size=bs, desc=f"bs{bs}"
        )
        dt = time.perf_counter() - t
        n = sum(len(o) for o in outs)
        toks = sum(s["n_tokens"] for o in outs for s in o)
        results.append(
            {
                "batch_size": bs,
                "samples": n,
                "seconds": dt,
                "samples_per_s": n / dt,
                "tokens_per_s": toks / dt,
            }
        )
    base = results[0]["samples_per_s"]
    print(f"{args.prompts} prompts x k={args.k} on models/tiny-arith, T=0.8, max_new_tokens 48")
    for r in results:
        print(
            f"batch {r['batch_size']:4d}: {r['samples_per_s']:8.1f} samples/s  "
            f"{r['tokens_per_s']:8.0f} tok/s  {r['seconds']:6.1f} s  "
            f"x{r['samples_per_s'] / base:.2f} vs batch {results[0]['batch_size']}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
