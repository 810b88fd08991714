"""Coverage-selected corpora, as lineage 000's R2d: an exact integer program over candidate rows
(docs/lineages.md#000-lineage-and-corpora).

Each candidate row has an id, a prompt id, a group (a math category or a constraint family) and
a token count. With x_i in {0, 1} for "row i is kept", the program is

    maximise    sum_i w[group_i] * x_i
    subject to  sum_{i of prompt p} x_i <= 1                    for every prompt p
                sum_{i of group g}  x_i >= min_per_group[g]      for every g with a minimum
                sum_{i of group g}  x_i <= max_per_group[g]      for every g with a maximum
                sum_i x_i <= row_budget                          (if given)
                sum_i tokens_i * x_i <= token_budget             (if given)

solved exactly by CBC through pulp. Weights default to 1 per row; weights="inverse" gives each
group a total weight of 1 spread over its prompts, so a budget is spent on rare groups first.
Infeasible programs raise CoverageError with the reason.

    python -m arenaflow.corpora.coverage --rows corpora/C/rows.jsonl --group-field category
        --token-field n_tokens --row-budget 1000 --min-per-group '{"cnt": 50}' --out chosen.json
"""

from __future__ import annotations

import argparse
import collections
import json
import warnings
from dataclasses import asdict, dataclass

import pulp

from arenaflow import io


class CoverageError(ValueError):
    pass


@dataclass
class Selection:
    ids: list[str]  # chosen row ids, in input order
    objective: float  # the optimal objective value
    per_group: dict[str, int]  # chosen rows per group (every group, zeros included)
    tokens: int  # tokens of the chosen rows
    status: str  # CBC's status ("Optimal")


def select(
    rows: list[dict],
    *,
    row_budget: int | None = None,
    token_budget: int | None = None,
    min_per_group: dict[str, int] | None = None,
    max_per_group: dict[str, int] | None = None,
    weights: dict[str, float] | str | None = None,
    group_field: str = "group",
    token_field: str = "tokens",
    prompt_field: str = "prompt_id",
) -> Selection:
    """Choose the rows that maximise group-weighted coverage; see the module docstring.
    A row without `prompt_field` is its own prompt."""
    if row_budget is None and token_budget is None:
        raise CoverageError("give a row_budget, a token_budget or both")
    for name, b in (("row_budget", row_budget), ("token_budget", token_budget)):
        if b is not None and (not isinstance(b, int) or b < 0):
            raise CoverageError(f"{name} must be a non-negative integer, got {b!r}")
    ids, groups, prompts, tokens = _columns(rows, group_field, prompt_field, token_field)
    mins, maxs = dict(min_per_group or {}), dict(max_per_group or {})
    w = _weights(weights, groups, prompts)
    _precheck(groups, prompts, tokens, row_budget, token_budget, mins, maxs)

    prob = pulp.LpProblem("coverage", pulp.LpMaximize)
    x = [binary(prob, f"x{i}") for i in range(len(rows))]
    prob += pulp.lpSum(w[g] * xi for g, xi in zip(groups, x))
    for xs in _by(prompts, x).values():
        if len(xs) > 1:
            prob += pulp.lpSum(xs) <= 1
    by_group = _by(groups, x)
    for g, m in mins.items():
        if m > 0:
            prob += pulp.lpSum(by_group[g]) >= m
    for g, m in maxs.items():
        if g in by_group:
            prob += pulp.lpSum(by_group[g]) <= m
    if row_budget is not None:
        prob += pulp.lpSum(x) <= row_budget
    if token_budget is not None:
        prob += pulp.lpSum(t * xi for t, xi in zip(tokens, x)) <= token_budget
    status = pulp.LpStatus[prob.solve(cbc())]
    if status != "Optimal":
        raise CoverageError(
            f"CBC status {status}: no subset keeps at most one row per prompt "
            f"and meets the minimums {mins} and maxima {maxs} "
            f"within row_budget={row_budget}, token_budget={token_budget}"
        )
    chosen = [i for i, xi in enumerate(x) if xi.value() is not None and xi.value() > 0.5]
    return Selection(
        ids=[ids[i] for i in chosen],
        objective=float(pulp.value(prob.objective) or 0.0),
        per_group=_per_group(groups, chosen),
        tokens=sum(tokens[i] for i in chosen),
        status=status,
    )


def _columns(
    rows: list[dict], group_field: str, prompt_field: str, token_field: str
) -> tuple[list[str], list[str], list[str], list[int]]:
    """Each row's id, group, prompt and token count, in row order; no rows, or an id on two
    rows, raises CoverageError."""
    if not rows:
        raise CoverageError("no candidate rows")
    ids = [str(r["id"]) for r in rows]
    dup = [i for i, c in collections.Counter(ids).items() if c > 1]
    if dup:
        raise CoverageError(f"duplicate row ids: {sorted(dup)[:5]}")
    return (
        ids,
        [str(r[group_field]) for r in rows],
        [str(r.get(prompt_field, r["id"])) for r in rows],
        [int(r[token_field]) for r in rows],
    )


def _by(keys: list[str], x: list) -> dict[str, list]:
    """The variables x grouped by their rows' keys (a prompt or a group)."""
    out = collections.defaultdict(list)
    for k, xi in zip(keys, x):
        out[k].append(xi)
    return out


def _per_group(groups: list[str], chosen: list[int]) -> dict[str, int]:
    """Chosen rows per group, every group present (zeros included), by name."""
    out = dict.fromkeys(sorted(set(groups)), 0)
    for i in chosen:
        out[groups[i]] += 1
    return out


def binary(prob: pulp.LpProblem, name: str) -> pulp.LpVariable:
    """A 0/1 variable of `prob`."""
    # PuLP >= 3.3 wants variables made by their problem; older PuLP only has LpVariable(...)
    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, 0, 1, cat="Binary")
    return pulp.LpVariable(name, cat="Binary")


def cbc():
    """CBC: a system `cbc` (COIN_CMD, what PuLP 4 expects) if there is one, else the binary
    PuLP 3 bundles (PULP_CBC_CMD, deprecated there but the one every pip install has)."""
    coin = pulp.COIN_CMD(msg=False)
    if coin.available():
        return coin
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False)


def _weights(weights, groups: list[str], prompts: list[str]) -> dict[str, float]:
    present = set(groups)
    if weights is None:
        return dict.fromkeys(present, 1.0)
    if weights == "inverse":
        # per distinct prompt, not per row: several candidates of one prompt count once
        n_prompts = collections.Counter(g for g, _ in set(zip(groups, prompts)))
        return {g: 1.0 / n_prompts[g] for g in present}
    if isinstance(weights, dict):
        missing = present - set(weights)
        if missing:
            raise CoverageError(f"weights has no entry for group(s) {sorted(missing)}")
        bad = {g: v for g, v in weights.items() if not isinstance(v, (int, float)) or v < 0}
        if bad:
            raise CoverageError(f"weights must be non-negative numbers; got {bad}")
        return {g: float(weights[g]) for g in present}
    raise CoverageError(f"weights must be None, 'inverse' or a dict; got {weights!r}")


def _precheck(groups, prompts, tokens, row_budget, token_budget, mins, maxs) -> None:
    """Name the reason for the infeasibilities a reader would want spelled out; CBC catches
    the rest (e.g. minimums that fit the row budget but not the tokens)."""
    for g, m in maxs.items():
        if not isinstance(m, int) or m < 0:
            raise CoverageError(f"max_per_group[{g!r}] must be a non-negative integer, got {m!r}")
    prompts_in = collections.defaultdict(set)
    for g, p in zip(groups, prompts):
        prompts_in[g].add(p)
    for g, m in mins.items():
        if not isinstance(m, int) or m < 0:
            raise CoverageError(f"min_per_group[{g!r}] must be a non-negative integer, got {m!r}")
        if m > len(prompts_in.get(g, ())):
            raise CoverageError(
                f"group {g!r} needs at least {m} rows but only "
                f"{len(prompts_in.get(g, ()))} prompts have a candidate in it"
            )
        if g in maxs and maxs[g] < m:
            raise CoverageError(f"group {g!r}: minimum {m} exceeds maximum {maxs[g]}")
    total_min = sum(mins.values())
    if row_budget is not None and total_min > row_budget:
        raise CoverageError(
            f"per-group minimums sum to {total_min} rows, over the row budget {row_budget}"
        )
    if token_budget is not None:
        # a lower bound on the tokens the minimums need: each group's m cheapest rows
        need = 0
        for g, m in mins.items():
            need += sum(sorted(t for gg, t in zip(groups, tokens) if gg == g)[:m])
        if need > token_budget:
            raise CoverageError(
                f"per-group minimums need at least {need} tokens, over the "
                f"token budget {token_budget}"
            )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", required=True, help="candidate rows (JSONL)")
    ap.add_argument("--group-field", default="category")
    ap.add_argument("--token-field", default="tokens")
    ap.add_argument("--prompt-field", default="prompt_id")
    ap.add_argument("--row-budget", type=int)
    ap.add_argument("--token-budget", type=int)
    ap.add_argument("--min-per-group", default="{}", help="JSON {group: minimum rows}")
    ap.add_argument("--max-per-group", default="{}", help="JSON {group: maximum rows}")
    ap.add_argument("--weights", default=None, help="'inverse' or JSON {group: weight}")
    ap.add_argument("--out", required=True, help="JSON: chosen ids, objective, per-group counts")
    args = ap.parse_args(argv)
    weights = args.weights
    if weights is not None and weights != "inverse":
        weights = json.loads(weights)
    sel = select(
        io.read_jsonl(args.rows),
        row_budget=args.row_budget,
        token_budget=args.token_budget,
        min_per_group=json.loads(args.min_per_group),
        max_per_group=json.loads(args.max_per_group),
        weights=weights,
        group_field=args.group_field,
        token_field=args.token_field,
        prompt_field=args.prompt_field,
    )
    io.write_json(args.out, asdict(sel))
    print(
        f"{len(sel.ids)} rows, objective {sel.objective:g}, per group {sel.per_group} -> {args.out}"
    )


if __name__ == "__main__":
    main()
