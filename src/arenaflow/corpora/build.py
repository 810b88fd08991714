"""Rejection-sampled (or reference) training corpora with an sha256 manifest.

    python -m arenaflow.corpora.build --corpus C --pool pools/P.jsonl [--samples S --verdicts V]
        --tokenizer DIR --system-prompt S --params-json '{...}' --out corpora/C

Writes corpora/C/{rows.jsonl, sft.npz, stats.json, manifest.json} (pairs.npz instead of sft.npz for
`format: pairs`: one verified and one failed answer per prompt, for DPO/SimPO). With verdicts, each
prompt keeps at most one verified-correct sample (by `select`: the median-length one by default);
unsolved prompts are dropped and counted; a prompt with fewer than k verdicts (a deleted row)
fails naming the verdicts file and the prompt; stats.json `verifier` names the math verifier
(arenaflow.verify.verifier) of this environment. Without (policy 'reference'), each prompt's worked
solution is the target. Rows whose prompt matches an evaluation item's (arenaflow.corpora.decontam:
on normalised text, the same tokens, a shared 30-token run, or a short prompt with words added
or removed) are dropped and listed with the rule (stats.json `decontamination`); `coverage:` then
keeps the subset an exact integer program picks under a row/token budget with per-group bounds
(stats.json `coverage`).
sft.npz holds the token ids of each rendered conversation and an assistant-only loss mask
(arenaflow.chat.encode_with_mask), concatenated, with row offsets.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
from pathlib import Path

import numpy as np
from scipy.special import comb

from arenaflow import candidates, chat, io, manifest, models, paths, verify
from arenaflow.pools.validate import no_template_markers, read_pool


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with c correct of n samples (Chen et al. 2021)."""
    if not (0 <= c <= n and 1 <= k <= n):
        # k > n would otherwise report pass@k = 1.0 for a prompt with no correct sample
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k, exact=True) / comb(n, k, exact=True)


def _short(verdicts_file: str, prompt_id: str, n: int, k: int) -> str:
    """Why a prompt's verdicts cannot be selected from: the candidates step writes k samples and
    a verdict for each, so fewer means a row was lost or deleted (pass@k needs n >= k)."""
    what = "no candidate samples" if n == 0 else f"{n} verdict(s), fewer than k = {k}"
    return (
        f"{verdicts_file}: prompt {prompt_id!r} has {what}: a verdict row is missing; rebuild "
        "the corpus's candidates"
    )


def pick(correct: list[dict], how: str, rng: random.Random) -> dict:
    """One verified sample: median (lower median by length), shortest, longest or random."""
    ranked = sorted(correct, key=lambda v: (v["chars"], v["sample"]))
    if how == "median":
        return ranked[(len(ranked) - 1) // 2]
    if how == "shortest":
        return ranked[0]
    if how == "longest":
        return ranked[-1]
    return rng.choice(ranked)


class Reverify:
    """Each sample a corpus keeps (and a pair's rejected one) verified again from its text and
    its prompt's gold or constraints: the verdicts file is the candidates step's output, and a
    verdict flipped there would otherwise train on a wrong answer under a valid manifest."""

    def __init__(self, samples: list[dict], params: dict, verdicts_file: str):
        self.samples = {s["id"]: s for s in samples}
        self.marker = (params.get("scaffold") or {}).get("marker")
        self.verdicts_file = verdicts_file

    def __call__(self, kept: dict, pool_row: dict) -> None:
        sample = self.samples.get(kept["id"])
        if sample is None or sample.get("prompt_id") != pool_row["id"]:
            raise ValueError(
                f"{self.verdicts_file}: verdict {kept['id']!r} of prompt {pool_row['id']!r} "
                "has no such sample in the samples file"
            )
        again = candidates.verdict(sample, pool_row, self.marker)["correct"]
        if again != kept["correct"]:
            raise ValueError(
                f"{self.verdicts_file}: verdict {kept['id']!r} says correct={kept['correct']}, "
                f"but its sample re-verified against prompt {pool_row['id']!r} gives "
                f"correct={again} (the verdict was edited, or the samples changed after it)"
            )


def select(
    pool: list[dict],
    samples: list[dict],
    verdicts: list[dict],
    params: dict,
    verdicts_file: str = "verdicts",
) -> tuple[list[dict], dict]:
    """Rejection sampling: (rows, stats) with at most one kept sample per prompt. A scaffolded
    sample's target is its verdict's `final` answer, never the draft (arenaflow.candidates).
    A prompt with fewer verdicts than k fails naming `verdicts_file` and the prompt."""
    texts = {s["id"]: s["text"] for s in samples}
    if params.get("scaffold"):
        if params.get("format") == "pairs":
            raise ValueError(
                "a scaffolded corpus has no pairs format: a rejected sample may "
                "have no final answer to train against"
            )
        missing = next((v["id"] for v in verdicts if "final" not in v), None)
        if missing is not None:
            raise ValueError(
                f"verdict {missing!r} has no 'final' answer: verify a scaffolded corpus's "
                "candidates with its marker (candidates verify --marker)"
            )
        texts = {v["id"]: v["final"] for v in verdicts}
    by_prompt = collections.defaultdict(list)
    for v in verdicts:
        by_prompt[v["prompt_id"]].append(v)
    check = Reverify(samples, params, verdicts_file)
    rng = random.Random(params["seed"])
    rows, p1, pk, solved = [], [], [], 0
    for r in pool:
        vs = by_prompt.get(r["id"], [])
        n, c = len(vs), sum(v["correct"] for v in vs)
        if n < params["k"]:
            raise ValueError(_short(verdicts_file, r["id"], n, params["k"]))
        p1.append(c / n)
        pk.append(pass_at_k(n, c, params["k"]))
        ok = [v for v in vs if v["correct"] and v["chars"] >= params["min_chars"]]
        solved += c > 0
        if params.get("format") == "pairs":
            # A preference pair needs a verified answer and a failed one to the same prompt.
            bad = [v for v in vs if not v["correct"]]
            if ok and bad:
                v, w = pick(ok, params["select"], rng), pick(bad, params["select"], rng)
                check(v, r), check(w, r)
                rows.append(
                    {
                        **_row(r, texts[v["id"]], source=v["id"]),
                        "rejected": texts[w["id"]],
                        "rejected_source": w["id"],
                        "rejected_sha256": manifest.sha256_text(texts[w["id"]]),
                    }
                )
        elif ok:
            v = pick(ok, params["select"], rng)
            check(v, r)
            rows.append(_row(r, texts[v["id"]], source=v["id"]))
    stats = {
        "prompts": len(pool),
        "solved": solved,
        "unsolved_dropped": len(pool) - solved,
        "below_min_chars_dropped": solved - len(rows),
        "pass_at_1": float(np.mean(p1)),
        f"pass_at_{params['k']}": float(np.mean(pk)),
        "k": params["k"],
    }
    return rows, stats


def reference(pool: list[dict]) -> tuple[list[dict], dict]:
    missing = next((r["id"] for r in pool if not r.get("reference")), None)
    if missing is not None:
        raise ValueError(
            f"pool row {missing!r} has no 'reference' answer: policy 'reference' "
            "needs one on every row (use policy 'base' or an arm to sample instead)"
        )
    return [_row(r, r["reference"], source="reference") for r in pool], {"prompts": len(pool)}


def cover(rows: list[dict], tokenizer, system_prompt: str, spec: dict) -> tuple[list[dict], dict]:
    """Coverage selection (R2d's, docs/lineages.md#000-lineage-and-corpora): the subset that an
    exact integer program picks under the spec's row/token budget and per-group bounds
    (arenaflow.corpora.coverage)."""
    from arenaflow.corpora import coverage

    _, lengths = tokenize(rows, tokenizer, system_prompt)
    cands = [
        {"id": r["id"], "prompt_id": r["id"], "group": r["category"], "tokens": n}
        for r, n in zip(rows, lengths["row_tokens"])
    ]
    # A group that solved fewer rows than its minimum keeps all it has (recorded as a shortfall)
    # rather than failing the round: on-policy sampling decides how many rows exist.
    have = collections.Counter(c["group"] for c in cands)
    minimum = {g: min(m, have[g]) for g, m in (spec.get("min_per_group") or {}).items()}
    shortfall = {
        g: m - minimum[g] for g, m in (spec.get("min_per_group") or {}).items() if m > minimum[g]
    }
    sel = coverage.select(
        cands,
        row_budget=spec.get("row_budget"),
        token_budget=spec.get("token_budget"),
        min_per_group=minimum,
        max_per_group=spec.get("max_per_group"),
        weights=None if spec.get("weights", "uniform") == "uniform" else spec["weights"],
    )
    chosen = set(sel.ids)
    return [r for r in rows if r["id"] in chosen], {
        "objective": sel.objective,
        "per_group": sel.per_group,
        "tokens": sel.tokens,
        "status": sel.status,
        "candidates": len(rows),
        "min_shortfall": shortfall,
        **spec,
    }


def _row(pool_row: dict, completion: str, source: str) -> dict:
    context = {"context": pool_row["context"]} if pool_row.get("context") else {}
    return {
        **context,  # the earlier turns of a multi-turn row (pools kind chat), rendered before it
        "id": pool_row["id"],
        "category": pool_row["category"],
        "prompt": pool_row["prompt"],
        "completion": completion,
        "source": source,
        "prompt_sha256": manifest.sha256_text(pool_row["prompt"]),
        "completion_sha256": manifest.sha256_text(completion),
    }


def tokenize(
    rows: list[dict], tokenizer, system_prompt: str, field: str = "completion", prefix: str = ""
) -> tuple[dict, dict]:
    """npz arrays (ids, assistant-only loss mask, row offsets) of each row's prompt + `field`,
    and token statistics."""
    convs = [
        chat.row_messages(system_prompt, r) + [{"role": "assistant", "content": r[field]}]
        for r in rows
    ]
    ids, mask = [], []
    for i, m in chat.encode_many_with_mask(tokenizer, convs):
        ids.append(i)
        mask.append(m)
    lengths = [len(i) for i in ids]
    arrays = {
        f"{prefix}input_ids": np.concatenate(ids) if ids else np.zeros(0, np.int32),
        f"{prefix}loss_mask": np.concatenate(mask) if mask else np.zeros(0, np.int8),
        f"{prefix}offsets": np.r_[0, np.cumsum(lengths)].astype(np.int64),
    }
    n = max(len(rows), 1)
    return arrays, {
        "row_tokens": np.diff(arrays[f"{prefix}offsets"]).tolist(),
        "tokens": int(sum(lengths)),
        "supervised_tokens": int(arrays[f"{prefix}loss_mask"].sum()),
        "mean_tokens_per_row": sum(lengths) / n,
        "mean_completion_chars": sum(len(r[field]) for r in rows) / n,
    }


def build(
    out: Path,
    pool: list[dict],
    tokenizer,
    system_prompt: str,
    params: dict,
    samples: list[dict] | None = None,
    verdicts: list[dict] | None = None,
    eval_items: list[dict] | None = None,
    verdicts_file: str = "verdicts",
    chat_template: str | None = None,
) -> dict:
    """Select, decontaminate against `eval_items`, optionally coverage-select, tokenise and
    write the corpus atomically; return its stats (with the manifest digest). `verdicts_file`
    names the verdicts in errors; `chat_template` is base.chat_template as the tokenizer was
    loaded with it (recorded with the template's sha256, chat.template_record)."""
    from arenaflow.corpora import decontam

    if verdicts is None:
        rows, stats = reference(pool)
    else:
        rows, stats = select(pool, samples, verdicts, params, verdicts_file)
        stats.update(verify.meta(pool))
    if eval_items is not None:
        rows, stats["decontamination"] = decontam.decontaminate(rows, eval_items)
    if params.get("coverage"):
        rows, stats["coverage"] = cover(rows, tokenizer, system_prompt, params["coverage"])
    if not rows:
        raise ValueError(f"{out}: no rows survived selection ({stats}); nothing to train on")
    pairs = params.get("format") == "pairs"
    arrays, tok_stats = tokenize(rows, tokenizer, system_prompt, prefix="chosen_" if pairs else "")
    if pairs:
        rejected, rej_stats = tokenize(rows, tokenizer, system_prompt, "rejected", "rejected_")
        arrays.update(rejected)
        tok_stats["rejected_tokens"] = rej_stats["tokens"]
    tok_stats.pop("row_tokens")
    stats.update(
        tok_stats,
        rows=len(rows),
        rows_by_category=dict(sorted(collections.Counter(r["category"] for r in rows).items())),
    )
    with io.atomic_dir(out) as tmp:
        io.write_jsonl(tmp / "rows.jsonl", rows)
        np.savez(tmp / ("pairs.npz" if pairs else "sft.npz"), **arrays)
        io.write_json(tmp / "stats.json", stats)
        template = chat.template_record(tokenizer, chat_template)
        recorded = {**params, "system_prompt": system_prompt, "chat_template": template}
        record = manifest.write(tmp, params=recorded, written_as=out)
    stats["digest"] = record["digest"]
    return stats


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True, help="corpus id")
    ap.add_argument("--pool", required=True, help="pools/{pool}.jsonl")
    ap.add_argument("--samples", help="candidates/{corpus}/samples.jsonl (omit for 'reference')")
    ap.add_argument("--verdicts", help="candidates/{corpus}/verdicts.jsonl (omit for 'reference')")
    ap.add_argument("--tokenizer", required=True, help="tokenizer directory (the base model's)")
    ap.add_argument("--system-prompt", default="", help="system turn of every training row")
    ap.add_argument(
        "--chat-template",
        default=None,
        help="base.chat_template: own, chatml or a .jinja file (default: the tokenizer's as saved)",
    )
    ap.add_argument(
        "--eval-pools",
        nargs="*",
        default=None,
        help="evaluation pools to decontaminate against (arenaflow.corpora.decontam)",
    )
    ap.add_argument("--params-json", required=True, help="the corpus's config section as JSON")
    ap.add_argument("--out", required=True, help="corpora/{corpus}")
    args = ap.parse_args(argv)
    if (args.samples is None) != (args.verdicts is None):
        ap.error("--samples and --verdicts go together")
    who = f"corpus {args.corpus}"
    pool, tokenizer = (
        read_pool(args.pool, who),
        models.load_tokenizer(args.tokenizer, args.chat_template),
    )
    no_template_markers(pool, args.pool, chat.markers(tokenizer))
    stats = build(
        Path(args.out),
        pool,
        tokenizer,
        args.system_prompt,
        json.loads(args.params_json),
        manifest.read_jsonl(args.samples, who, paths.SAMPLES) if args.samples else None,
        manifest.read_jsonl(args.verdicts, who, paths.VERDICTS) if args.verdicts else None,
        [row for p in args.eval_pools for row in read_pool(p)]
        if args.eval_pools is not None
        else None,
        verdicts_file=args.verdicts or "verdicts",
        chat_template=args.chat_template,
    )
    print(f"corpus {args.corpus}: {json.dumps(stats, sort_keys=True)}")


if __name__ == "__main__":
    main()
