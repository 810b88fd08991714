"""Pre-register a round's bar, then apply it to the candidates and name the arm it promotes.

    python -m arenaflow.nominate register --round r3 --round-json '{...}' --out nominations/r3.bar.json
    python -m arenaflow.nominate judge --round r3 --round-json '{...}' \
        --registration nominations/r3.bar.json --compare compare/math/greedy/B1__R2d.json ... \
        [--noise noise/math/served/R2d.json ...] --readouts readouts/math/B1/greedy.r0.parquet ... \
        --out nominations/r3.json

The bar is written before the readouts it judges. `register` records the round's bar (defaults
resolved, arenaflow.bar), its sha256 and a UTC time; it depends on the round's config alone.
`judge` refuses (exit 1) when the config's bar no longer has the registered sha256, or when any
candidate readout it judges was created before the registration, i.e. the bar was (re)written
after scoring. Creation times are those recorded inside the files (registration: registered_utc;
readout: parquet metadata created_utc), not mtimes, which `touch` and copies change; only a
readout without a recorded time falls back to its mtime. Reference readouts (incumbent,
control, noise floor) may be older: they are shared across rounds, and the bar may be calibrated
on them, as seeds/000 fixed its final bar on a noise floor measured before it.

Among the candidates that clear every clause the largest delta on the round's suite/regime
against the incumbent is promoted (ties: the first listed); when none clears, the incumbent
stays. The output records every clause's number and verdict per candidate, and why.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

from arenaflow import bar, io, manifest
from arenaflow.bar import bar_sha256

HONEST = ("A new round id is the honest way to change a bar: give the new bar its own round, "
          "registered before the readouts it judges.")


class RegistrationError(RuntimeError):
    pass


def utcnow() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")


def register(round_id: str, rnd: dict, now: str | None = None) -> dict:
    resolved = bar.resolve(rnd)
    return {"round": round_id, "bar": rnd["bar"], "bar_resolved": resolved,
            "bar_sha256": bar_sha256(resolved), "round_config": rnd,
            "registered_utc": now or utcnow(), "code": manifest.code_version()}


def _time(s: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(s)
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def check_registration(round_id: str, rnd: dict, registration: dict,
                       readout_times: dict[str, tuple[str, str]]) -> None:
    """Raise RegistrationError unless the registered bar is the config's bar and was registered
    no later than every candidate readout; readout_times = {path: (utc iso, 'recorded'|'mtime')}."""
    if registration.get("round") != round_id:
        raise RegistrationError(f"round {round_id}: the registration is for round "
                                f"{registration.get('round')!r}")
    sha, reg_sha, reg_at = bar_sha256(bar.resolve(rnd)), registration["bar_sha256"], registration["registered_utc"]
    if sha != reg_sha:
        raise RegistrationError(
            f"round {round_id}: refused. The bar in the config (sha256 {sha[:16]}...) is not the bar "
            f"registered at {reg_at} (sha256 {reg_sha[:16]}...): the bar was edited after registration. "
            + HONEST)
    late = [(p, t, how) for p, (t, how) in sorted(readout_times.items()) if _time(t) < _time(reg_at)]
    if late:
        p, t, how = min(late, key=lambda x: _time(x[1]))
        raise RegistrationError(
            f"round {round_id}: refused. The bar was registered at {reg_at}, after {len(late)} of the "
            f"{len(readout_times)} candidate readouts it judges were made (e.g. {p}, created {t}, "
            f"{'recorded in the file' if how == 'recorded' else 'file mtime'}): the bar was written or "
            f"re-registered after scoring, so it is not pre-registered. " + HONEST)


def readout_time(path: str) -> tuple[str, str]:
    from arenaflow import evals  # pandas/pyarrow: only where readouts are read

    created = evals.readout_meta(path).get("created_utc")
    if created:
        return created, "recorded"
    mtime = dt.datetime.fromtimestamp(os.path.getmtime(path), dt.timezone.utc)
    return mtime.isoformat(timespec="microseconds"), "mtime"


def _key(rnd: dict, k) -> tuple:
    # {candidate: comparison vs the incumbent on the round's suite/regime} is shorthand
    return (rnd["suite"], rnd["regime"], k, rnd["incumbent"]) if isinstance(k, str) else tuple(k)


def judge(candidate: str, rnd: dict, compares: dict, noises: dict | None = None) -> dict:
    primary = compares[(rnd["suite"], rnd["regime"], candidate, rnd["incumbent"])]
    clauses = [bar.judge_clause(c, candidate, rnd["incumbent"], compares, noises or {})
               for c in bar.resolve(rnd)]
    return {"arm": candidate, "clears": all(c["holds"] for c in clauses), "clauses": clauses,
            "failed": [c["clause"] for c in clauses if not c["holds"]],
            **{k: primary.get(k) for k in ("delta", "wins", "losses", "p_value", "ci95", "t",
                                           "t_items", "accuracy", "ref_accuracy")}}


def nominate(round_id: str, rnd: dict, comparisons: dict, noises: dict | None = None) -> dict:
    """comparisons: {(suite, regime, cand, ref): compare JSON}, or {cand: compare JSON vs the
    incumbent on the round's suite/regime}; noises: {(suite, regime, arm): noise JSON}."""
    compares = {_key(rnd, k): v for k, v in comparisons.items()}
    missing = sorted({f"{c} vs {ref} on {s}/{r}" for s, r, c, ref in bar.comparisons_needed(rnd)
                      if (s, r, c, ref) not in compares})
    if missing:
        raise ValueError(f"round {round_id}: no comparison for {missing}")
    verdicts = [judge(c, rnd, compares, noises) for c in rnd["candidates"]]
    cleared = [v for v in verdicts if v["clears"]]
    where = f"{rnd['suite']}/{rnd['regime']}"
    if cleared:
        best = max(cleared, key=lambda v: v["delta"])  # max keeps the first of equal deltas
        promoted = best["arm"]
        reason = (f"{promoted} clears every clause with the largest delta among "
                  f"{len(cleared)} that clear ({best['delta']:+.2f} pt vs {rnd['incumbent']} on {where})")
    else:
        promoted = rnd["incumbent"]
        fails = "; ".join(f"{v['arm']} fails " + ", ".join(
            bar.describe(c) for c in v["clauses"] if not c["holds"]) for v in verdicts)
        reason = f"no candidate clears the bar; the incumbent {promoted} stays ({fails})"
    resolved = bar.resolve(rnd)
    return {"round": round_id, "suite": rnd["suite"], "regime": rnd["regime"],
            "incumbent": rnd["incumbent"], "control": rnd.get("control"), "bar": rnd["bar"],
            "bar_resolved": resolved, "bar_sha256": bar_sha256(resolved),
            "candidates": verdicts, "promoted": promoted, "reason": reason}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("register", help="record the round's bar, its sha256 and the time")
    j = sub.add_parser("judge", help="apply the registered bar; write the nomination")
    for p in (r, j):
        p.add_argument("--round", required=True, help="round id")
        p.add_argument("--round-json", required=True, help="the round's config section as JSON")
    r.add_argument("--out", required=True, help="nominations/{round}.bar.json")
    j.add_argument("--registration", required=True, help="nominations/{round}.bar.json")
    j.add_argument("--compare", nargs="+", required=True, help="compare JSONs the bar reads")
    j.add_argument("--noise", nargs="*", default=[], help="noise JSONs the bar reads")
    j.add_argument("--readouts", nargs="*", default=[], help="the candidates' readouts it judges")
    j.add_argument("--out", required=True, help="nominations/{round}.json")
    args = ap.parse_args(argv)
    rnd = json.loads(args.round_json)
    if args.cmd == "register":
        rec = register(args.round, rnd)
        io.write_json(args.out, rec)
        print(f"round {args.round}: bar sha256 {rec['bar_sha256']} registered at {rec['registered_utc']}")
        return
    registration = io.read_json(args.registration)
    try:
        check_registration(args.round, rnd, registration, {p: readout_time(p) for p in args.readouts})
    except RegistrationError as e:
        print(e, file=sys.stderr)
        raise SystemExit(1) from None
    compares = {}
    for path in args.compare:
        c = io.read_json(path)
        s, g = c.get("suite") or rnd["suite"], c.get("regime") or rnd["regime"]
        compares[(s, g, c["cand"], c["ref"])] = c
    noises = {}
    for path in args.noise:
        nz = io.read_json(path)
        noises[(nz["suite"], nz["regime"], nz["arm"])] = nz
    result = nominate(args.round, rnd, compares, noises)
    result["registration"] = {"path": args.registration, "registered_utc": registration["registered_utc"],
                              "bar_sha256": registration["bar_sha256"],
                              "readouts_checked": len(args.readouts)}
    io.write_json(args.out, result)
    for v in result["candidates"]:
        print(f"  {v['arm']}: delta {v['delta']:+.2f} W/L {v['wins']}/{v['losses']} -> "
              f"{'clears' if v['clears'] else 'fails clauses ' + str(v['failed'])}")
    print(f"round {args.round}: promoted {result['promoted']} ({result['reason']})")


if __name__ == "__main__":
    main()
