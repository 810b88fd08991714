"""What a readout's decoder costs before its first token, on one GPU.

    python benchmarks/decode_prepare_gpu.py [--batch 600 --prompt 128 --new-tokens 160]
        [--warmups 2,1] [--decode-warmup] [--out results.json]

A lineage readout decodes 600 prompts greedy, then three replicates sampled as served, through
the static engine's hf step with CUDA graphs (transformers' modelling code, SmolLM2-135M's shape
here with random bf16 weights, so that no row stops early). For each --warmups value
(decode.CAPTURE_WARMUPS: eager runs of a step before its capture; 2 until 2026-12-04; since
then the first bucket's only, a later bucket's first real step warming it) in one
process: the first greedy batch of a fresh decoder (its graphs captured), a second (replays
only), the first sampled batch through the same decoder (decode.decoder_for keeps one per shape:
one more graph, the token choice's), and the first sampled batch of a decoder of its own (what
each decoding cost until 2026-12-04, when decoders were kept per decoding). Prints seconds and
each first batch's overhead over a replayed one. The first row also pays the process's first
use of each kernel, unless --decode-warmup ran arenaflow.decode.warmup (a greedy prompt pass
and step of a one-layer copy, on a side thread) while the model was built and moved to the GPU,
as a readout's load does: run the script in fresh processes with and without it to see what it
takes off a job's first batch.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from zero_stage_cpu import SHAPES  # sibling script

from arenaflow.decode import sampling
from arenaflow.decode import static as decode
from arenaflow.decode import steps as decode_steps
from arenaflow.decode import warmup as decode_warmup

GREEDY = sampling.Decoding(temperature=0.0, max_new_tokens=160)
SERVED = sampling.Decoding(temperature=0.7, top_p=0.95, max_new_tokens=160)


def timed(decoder, ids, mask) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    decoder.run(ids, mask)
    torch.cuda.synchronize()
    return time.perf_counter() - t


def measure(model, args, warmups: int) -> dict:
    decode.CAPTURE_WARMUPS = warmups
    model.__dict__.pop("_arenaflow_decoders", None)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (args.batch, args.prompt), generator=g).cuda()
    mask = torch.ones_like(ids)
    shape = (args.batch, args.prompt, args.new_tokens)
    row = {"warmups": warmups}
    decode_steps.plan(args.batch * args.new_tokens)  # as sampling.generate plans a readout's batch
    shared = decode.decoder_for(model, *shape, GREEDY, [-1], 0)
    row["greedy_first_s"] = timed(shared, ids, mask)
    row["greedy_second_s"] = timed(decode.decoder_for(model, *shape, GREEDY, [-1], 0), ids, mask)
    row["served_first_shared_s"] = timed(
        decode.decoder_for(model, *shape, SERVED, [-1], 0), ids, mask
    )
    row["served_second_s"] = timed(shared, ids, mask)
    own = decode.StaticDecoder(model, *shape, SERVED, [-1], 0)
    row["served_first_own_decoder_s"] = timed(own, ids, mask)
    row["buckets"] = len(shared.graphs)
    row["path"] = shared.path
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=600)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=160)
    # the first row also pays the process's first use of each kernel
    ap.add_argument("--warmups", default="2,2,1,2,1")
    ap.add_argument(
        "--decode-warmup", action="store_true", help="arenaflow.decode.warmup beside the load"
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPES["smollm2"])
    warm, t = None, time.perf_counter()
    if args.decode_warmup:
        with tempfile.TemporaryDirectory() as base:
            cfg.save_pretrained(base)
            warm = decode_warmup.launch(base, torch.device("cuda", 0), args.batch, args.new_tokens)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    loaded = time.perf_counter()
    warmed = decode_warmup.finish(warm)
    print(
        f"model built and on the GPU {loaded - t:.2f} s, then {time.perf_counter() - loaded:.2f} "
        "s waiting for the warm-up",
        flush=True,
    )
    rows = []
    for w in map(int, args.warmups.split(",")):
        r = measure(model, args, w)
        rows.append(r)
        print(
            f"warm-ups {w}: {r['buckets']} buckets ({r['path']}); greedy first "
            f"{r['greedy_first_s']:.3f} s, second {r['greedy_second_s']:.3f} s; served first "
            f"through the same decoder {r['served_first_shared_s']:.3f} s, second "
            f"{r['served_second_s']:.3f} s, first through its own decoder "
            f"{r['served_first_own_decoder_s']:.3f} s",
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            device = torch.cuda.get_device_name()
            json.dump({"args": vars(args), "device": device, "warmup": warmed, "rows": rows}, f)


if __name__ == "__main__":
    main()
