"""Multi-turn instruction-following readouts (lineage 002's "four-turn conversations with
constraints introduced across turns", docs/lineages.md#002-headline-reads).

A pool row with `turns` (arenaflow.instruct.pool.conversations, or an import) is a conversation of
user messages; turn k introduces constraints[k-1], which holds from then on. The readout
(arenaflow.evals.readout_rows.readout dispatches here) generates turn by turn, every
conversation of the pool batched per turn, through the same chat rendering and sampling path as
a single-turn readout, with the model's *own* earlier replies in context. Turn k decodes with
seed + TURN_SEED * (k-1).

One readout row per conversation x turn: item_id "{conversation}/t{k}", `conversation`, `turn`,
the conversation's category; `correct` is that turn's verdict (arenaflow.candidates.verdict
against constraints[:k]); `checks` the per-constraint verdicts (arenaflow.instruct.families).
`prompt_sha256` hashes what both sides of a comparison share, the system prompt and the user
messages up to turn k (the rendered prompt also holds each arm's own replies: `context_sha256`).

arenaflow.evals.compare.compare pairs such readouts per conversation: its outcome is "every turn
passes" (conversations() below), with each turn's paired accuracy under `by_turn`; levels (the
structural battery's rates) stay per turn.
"""

from __future__ import annotations

import json

import pandas as pd

from arenaflow import manifest
from arenaflow.evals import stats

TURN_SEED = 7919  # turn k decodes with seed + TURN_SEED * (k - 1)


def _shared_prompt(system_prompt: str, turns: list[str]) -> str:
    return json.dumps({"system": system_prompt, "turns": turns}, sort_keys=True)


def readout(pool, model, tokenizer, system_prompt, dec, seed, batch_size, desc, engine) -> list:
    """Readout records (evals.readout_rows.structure adds the battery), turn by turn; `dec` is a
    sampling.Decoding."""
    from arenaflow import candidates, chat
    from arenaflow.decode import sampling
    from arenaflow.instruct import families  # torch-heavy

    convs = [chat.prompt_messages(system_prompt, r["turns"][0]) for r in pool]
    fmt = chat.format_of(tokenizer)
    recs = []
    for k in range(max(len(r["turns"]) for r in pool)):
        live = [i for i, r in enumerate(pool) if len(r["turns"]) > k]
        prompts = [chat.render(convs[i], True, fmt) for i in live]
        outs = sampling.generate(
            model,
            tokenizer,
            prompts,
            dec,
            k=1,
            seed=seed + TURN_SEED * k,
            batch_size=batch_size,
            desc=f"{desc} turn {k + 1}",
            engine=engine,
        )
        for i, p, (o,) in zip(live, prompts, outs):
            r = pool[i]
            turn = {"id": f"{r['id']}/t{k + 1}", "constraints": r["constraints"][: k + 1]}
            v = candidates.verdict({"id": turn["id"], "prompt_id": r["id"], "sample": 0, **o}, turn)
            recs.append(
                {
                    "item_id": turn["id"],
                    "conversation": r["id"],
                    "turn": k + 1,
                    "category": r["category"],
                    "prompt_sha256": manifest.sha256_text(
                        _shared_prompt(system_prompt, r["turns"][: k + 1])
                    ),
                    "context_sha256": manifest.sha256_text(p),
                    "target_sha256": manifest.sha256_text(
                        json.dumps(turn["constraints"], sort_keys=True)
                    ),
                    "completion": o["text"],
                    "n_tokens": o["n_tokens"],
                    "stopped": o["stopped"],
                    "pred": None,
                    "strict": v["correct"],
                    "reasons": "; ".join(v.get("reasons", [])),
                    "correct": v["correct"],
                    "checks": families.checks_of(o["text"], turn["constraints"]),
                }
            )
            convs[i].append({"role": "assistant", "content": o["text"]})
            if k + 1 < len(r["turns"]):
                convs[i].append({"role": "user", "content": r["turns"][k + 1]})
    return recs


def by_turn(m: pd.DataFrame) -> dict:
    """{turn: paired statistics of that turn's verdicts} over paired turn rows."""
    return {
        int(t): stats.paired(g["correct"].to_numpy(), g["correct_ref"].to_numpy())
        for t, g in m.groupby("turn", sort=True)
    }


def conversations(m: pd.DataFrame) -> pd.DataFrame:
    """Paired turn rows -> one row per (conversation, replicate): correct (and answer_usable)
    when every turn is, words summed over turns."""
    agg = {
        "category": ("category", "first"),
        "correct": ("correct", "all"),
        "correct_ref": ("correct_ref", "all"),
    }
    for col in ("answer_usable", "answer_usable_ref"):
        if col in m:
            agg[col] = (col, "all")
    for col in ("n_words", "n_words_ref"):
        if col in m:
            agg[col] = (col, "sum")
    out = m.groupby(["conversation", "replicate"], sort=True).agg(**agg).reset_index()
    return out.rename(columns={"conversation": "item_id"})
