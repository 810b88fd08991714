"""On-policy candidates: k samples per prompt from a policy, then a verdict for every sample.

    python -m arenaflow.candidates sample --pool pools/P.jsonl --base-model DIR [--adapter runs/A/final]
        --system-prompt S --params-json '{"k": 4, "temperature": 0.8, ...}' --out candidates/C/samples.jsonl
    python -m arenaflow.candidates verify --pool pools/P.jsonl --samples candidates/C/samples.jsonl
        --out candidates/C/verdicts.jsonl

A verdict records the extracted answer, strict and loose correctness, length, whether the
sample stopped on a stop token, and degeneracy flags (empty, U+FFFD). `correct` (what rejection
sampling keeps) = loose-correct, stopped, non-empty and free of U+FFFD.
"""

from __future__ import annotations

import argparse
import json

from arenaflow import chat, io, models, sampling, verify


def sample(pool: list[dict], model, tokenizer, system_prompt: str, params: dict) -> list[dict]:
    prompts = [chat.render(chat.prompt_messages(system_prompt, r["prompt"]), True) for r in pool]
    dec = sampling.Decoding(
        temperature=params["temperature"],
        top_p=params["top_p"],
        max_new_tokens=params["max_new_tokens"],
    )
    outs = sampling.generate(model, tokenizer, prompts, dec, k=params["k"], seed=params["seed"],
                             batch_size=params["batch_size"], desc="sample")
    rows = []
    for r, samples in zip(pool, outs):
        for j, s in enumerate(samples):
            rows.append({"id": f"{r['id']}#{j}", "prompt_id": r["id"], "sample": j, **s})
    return rows


def verdict(sample_row: dict, gold: str) -> dict:
    text = sample_row["text"]
    v = verify.check(text, gold)
    empty, fffd = not text.strip(), "\ufffd" in text
    return {
        "id": sample_row["id"],
        "prompt_id": sample_row["prompt_id"],
        "sample": sample_row["sample"],
        **v,
        "chars": len(text),
        "n_tokens": sample_row["n_tokens"],
        "stopped": sample_row["stopped"],
        "empty": empty,
        "fffd": fffd,
        "correct": v["loose"] and sample_row["stopped"] and not empty and not fffd,
    }


def verify_all(pool: list[dict], samples: list[dict], samples_path: str) -> list[dict]:
    gold = {r["id"]: r["gold"] for r in pool}
    out = []
    for line, s in enumerate(samples, start=1):
        if s.get("prompt_id") not in gold:
            raise ValueError(f"{samples_path}:{line}: prompt_id {s.get('prompt_id')!r} is not in the pool")
        out.append(verdict(s, gold[s["prompt_id"]]))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="k samples per prompt from a policy")
    s.add_argument("--pool", required=True, help="pools/{pool}.jsonl")
    s.add_argument("--base-model", required=True, help="base model directory")
    s.add_argument("--adapter", default=None, help="the policy arm's runs/{arm}/final (omit for base)")
    s.add_argument("--system-prompt", default="", help="system prompt for every prompt")
    s.add_argument("--params-json", required=True, help="the corpus's config section as JSON")
    s.add_argument("--out", required=True, help="candidates/{corpus}/samples.jsonl")
    v = sub.add_parser("verify", help="a verdict for every sample")
    v.add_argument("--pool", required=True)
    v.add_argument("--samples", required=True)
    v.add_argument("--out", required=True, help="candidates/{corpus}/verdicts.jsonl")
    args = ap.parse_args(argv)
    pool = io.read_jsonl(args.pool)
    if args.cmd == "sample":
        params = json.loads(args.params_json)
        model, tok = models.load_policy(args.base_model, args.adapter)
        rows = sample(pool, model, tok, args.system_prompt, params)
        io.write_jsonl(args.out, rows)
        print(f"{len(rows)} samples ({len(pool)} prompts x {params['k']}) -> {args.out}")
    else:
        rows = verify_all(pool, io.read_jsonl(args.samples), args.samples)
        io.write_jsonl(args.out, rows)
        print(f"{sum(r['correct'] for r in rows)}/{len(rows)} samples correct -> {args.out}")


if __name__ == "__main__":
    main()
