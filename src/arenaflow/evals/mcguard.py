"""A multiple-choice capability guard scored by log-likelihood, as lm-evaluation-harness does.

    python -m arenaflow.evals.mcguard --items data/mc/arith_facts.jsonl --base-model DIR
        [--adapter runs/A/final] --out guards/{guard}/{arm}.json

Lineage 003 guarded every candidate with MMLU (acc) and a preference set (acc_norm)
(docs/lineages.md#003-the-capability-guards). Each item is {id, question, choices, gold}; the
context is `Question: {question}\\nAnswer:` and each choice is scored as the continuation
` {choice}` (lm-eval's default target delimiter, a space), without a chat template: the summed
log-probability of the continuation's tokens given the context. Tokens as lm-eval's HFLM makes
them (`_encode_pair`): trailing spaces of the context move to the continuation, the whole text is
encoded and the continuation is what follows the context's own tokens; no special tokens.

Metrics, exactly lm-eval's (lm_eval/api/task.py, ConfigurableTask.process_results, 0.4.x,
output_type multiple_choice):
- acc: argmax over choices of the summed log-likelihood;
- acc_norm: argmax of log-likelihood / len(choice), the choice's length in *characters* (Python
  len of the choice string, without the delimiter);
- acc_bytes: argmax of log-likelihood / the choice's length in UTF-8 bytes.
Ties go to the first choice (numpy.argmax). The JSON holds each metric, n, and per item the
log-likelihoods and the three predictions, so two arms can be paired item by item, and
`seconds`, the scoring's wall time, which the GPU-minute budget counts as spent
(arenaflow.budget.ledger).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from arenaflow import io

DELIMITER = " "


def context(item: dict) -> str:
    return f"Question: {item['question']}\nAnswer:"


def load_items(path: str | Path) -> list[dict]:
    """The items of a multiple-choice file; ValueError naming file:line and the bad field."""
    items, seen = [], set()
    for line, row in io.read_jsonl_numbered(path):
        where = f"{path}:{line}"
        if not (isinstance(row.get("id"), str) and row["id"]) or row["id"] in seen:
            raise ValueError(f"{where}: 'id' must be a non-empty string, unique in the file")
        if not (isinstance(row.get("question"), str) and row["question"].strip()):
            raise ValueError(f"{where}: 'question' must be a non-empty string")
        ch = row.get("choices")
        if not (
            isinstance(ch, list) and len(ch) >= 2 and all(isinstance(c, str) and c for c in ch)
        ):
            raise ValueError(f"{where}: 'choices' must be a list of 2 or more non-empty strings")
        g = row.get("gold")
        if not (isinstance(g, int) and not isinstance(g, bool) and 0 <= g < len(ch)):
            raise ValueError(f"{where}: 'gold' must be an index into choices (0..{len(ch) - 1})")
        seen.add(row["id"])
        items.append(row)
    if not items:
        raise ValueError(f"{path}: no items")
    return items


def encode_pair(tokenizer, ctx: str, cont: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval's HFLM._encode_pair for a causal model."""
    n_spaces = len(ctx) - len(ctx.rstrip())
    if n_spaces:
        ctx, cont = ctx[:-n_spaces], ctx[-n_spaces:] + cont
    whole = tokenizer(ctx + cont, add_special_tokens=False)["input_ids"]
    ctx_ids = tokenizer(ctx, add_special_tokens=False)["input_ids"]
    return whole[: len(ctx_ids)], whole[len(ctx_ids) :]


def loglikelihood(model, tokenizer, ctx: str, cont: str) -> float:
    """Summed log-probability of `cont`'s tokens after `ctx`."""
    import torch

    ctx_ids, cont_ids = encode_pair(tokenizer, ctx, cont)
    ids = torch.tensor([ctx_ids + cont_ids], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1]).logits.float()
    logp = torch.log_softmax(logits[0, len(ctx_ids) - 1 :], dim=-1)
    return float(logp.gather(1, torch.tensor(cont_ids, device=model.device)[:, None]).sum())


def metrics(items: list[dict], lls: list[list[float]]) -> dict:
    """acc, acc_norm (characters), acc_bytes over items, and each item's predictions."""
    per_item = []
    for item, ll in zip(items, lls):
        ll = np.asarray(ll, dtype=float)
        chars = np.array([float(len(c)) for c in item["choices"]])
        nbytes = np.array([float(len(c.encode("utf-8"))) for c in item["choices"]])
        preds = {
            "pred": int(np.argmax(ll)),
            "pred_norm": int(np.argmax(ll / chars)),
            "pred_bytes": int(np.argmax(ll / nbytes)),
        }
        per_item.append({"id": item["id"], "gold": item["gold"], "lls": ll.tolist(), **preds})
    n = len(per_item)

    def rate(key):
        return sum(p[key] == p["gold"] for p in per_item) / n if n else 0.0

    return {
        "n": n,
        "acc": rate("pred"),
        "acc_norm": rate("pred_norm"),
        "acc_bytes": rate("pred_bytes"),
        "items": per_item,
    }


def score(model, tokenizer, items: list[dict]) -> dict:
    lls = [
        [loglikelihood(model, tokenizer, context(it), DELIMITER + c) for c in it["choices"]]
        for it in items
    ]
    return metrics(items, lls)


def main(argv: list[str] | None = None) -> None:
    from arenaflow import manifest, models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", required=True, help="a multiple-choice JSONL file")
    ap.add_argument("--base-model", required=True)
    ap.add_argument("--adapter", default=None, help="runs/{arm}/final (omit for base)")
    ap.add_argument("--arm", default=None, help="arm id, recorded")
    ap.add_argument("--out", required=True, help="guards/{guard}/{arm}.json")
    args = ap.parse_args(argv)
    items = load_items(args.items)
    model, tok = models.load_policy(args.base_model, args.adapter, consumer="mc guard")
    t0 = time.perf_counter()
    res = score(model, tok, items)
    res.update(
        seconds=round(time.perf_counter() - t0, 3),  # what the budget counts, with its overhead
        arm=args.arm,
        items_file=args.items,
        items_sha256=manifest.sha256_file(args.items),
        definition="lm-eval multiple_choice: acc argmax ll; acc_norm ll/chars; acc_bytes ll/bytes",
    )
    io.write_json(args.out, manifest.seal(res))
    print(
        f"{args.arm}: acc {res['acc']:.4f}, acc_norm {res['acc_norm']:.4f}, "
        f"acc_bytes {res['acc_bytes']:.4f} on {res['n']} items -> {args.out}"
    )


if __name__ == "__main__":
    main()
