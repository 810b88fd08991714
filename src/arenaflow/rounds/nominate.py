"""Pre-register a round's bar, then apply it to the candidates and name the arm it promotes.

    python -m arenaflow.rounds.nominate register --round r3 --round-json '{...}' \
        --out nominations/r3.bar.json
    python -m arenaflow.rounds.nominate judge --round r3 --round-json '{...}' \
        --registration nominations/r3.bar.json --compare compare/math/greedy/B1__R2d.json ... \
        [--noise noise/math/served/R2d.json ...] --readouts readouts/math/B1/greedy.r0.parquet ... \
        --out nominations/r3.json
    python -m arenaflow.rounds.nominate verify nominations/r3.json      # the seal and every file
    it names

The bar is written before the readouts it judges, and a round's registered bar never changes.
The record is an append-only registry, nominations/registry/{round}.jsonl (`--registry`), that
no rule declares as an output, so Snakemake never deletes it: `register` appends the round's
bar (defaults resolved, arenaflow.rounds.bar), its sha256 and a UTC time the first time it sees the
round, and from then on copies that entry to `--out`. A different bar for a registered round is
refused, whatever the readouts' times; a new round id is the way to change a bar, or the explicit,
logged `python -m arenaflow.rounds.reregister --round r3 --reason ...`, which retires the
registration in force and registers the config's bar (readouts must then be made after it).
Restoring the registered bar makes the round work again. A deleted or replaced registry does not
start the round afresh: `register` and `judge` refuse while the journal or the round's
nomination records a registration the registry lost (arenaflow.rounds.registry's check_traces).
rules/nominate.smk applies both checks while the DAG is built, so they stop even `snakemake -n`.

`judge` refuses (exit 1) when `--registration` is not the registry's entry, when the config's
bar is not the registered bar, or when any candidate readout it judges was created before the
registration. Creation times are those recorded inside the files (registration: registered_utc;
readout: parquet metadata created_utc), not mtimes, which `touch` and copies change; only a
readout without a recorded time falls back to its mtime. Reference readouts (incumbent,
control, noise floor) may be older: they are shared across rounds, and the bar may be calibrated
on them, as lineage 000 fixed its final bar on a noise floor measured before it
(docs/lineages.md#000-the-pre-registered-bar).

Among the candidates that clear every clause the largest delta on the round's suite/regime
against the incumbent is promoted (ties: the first listed); when none clears, the incumbent
stays. The output records every clause's number and verdict per candidate, and why, and is
sealed: `inputs` holds the sha256 of the registration and of every comparison, noise floor and
readout judged, and `digest` the sha256 of the record itself (canonical JSON, without `digest`).
Beside the power plan registered with the bar it records each clause's minimum detectable effect
as the readouts measured it (`power_measured`, arenaflow.rounds.gate), a flag that changes no
verdict.
A bundle is built only from a nomination whose seal and inputs verify (load_sealed).

This module holds the command line, the checks that refuse a changed bar and the seal
(rules/*.smk call check_bar, registered, check_lost and load_sealed while the DAG is built); the
verdicts and the promotion are arenaflow.rounds.verdicts', the registration record, the
registry's and the journal's reading and writing, the traces check and the re-registration
arenaflow.rounds.registry's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

from arenaflow import io, manifest, tracking
from arenaflow.rounds import bar, tracked
from arenaflow.rounds.bar import bar_sha256
from arenaflow.rounds.registry import (
    RegistrationError,
    active,
    backfill_journal,
    check_traces,
    read_registry,
    recorded,
    register,
    registry_path,
    reregister_hint,
)
from arenaflow.rounds.registry import record as record_event
from arenaflow.rounds.verdicts import nominate, promote


def honest(round_id: str) -> str:
    return (
        "A round's registered bar cannot change: a new round id is the honest way to change a "
        "bar (registered before the readouts it judges), or re-register this round explicitly: "
        + reregister_hint(round_id)
    )


class SealError(ValueError):
    pass


# --- the registry (arenaflow.rounds.registry): appending, and the checks against it ---------


def check_bar(round_id: str, rnd: dict, registered: dict | None, where: str) -> None:
    """Raise RegistrationError when the config's bar is not the registered bar."""
    if registered is None:
        return
    sha, reg_sha = bar_sha256(bar.clauses(rnd)), registered["bar_sha256"]
    if sha != reg_sha:
        raise RegistrationError(
            f"round {round_id}: refused. The bar in the config (sha256 {sha[:16]}...) "
            f"is not the bar registered for {round_id} at {registered['registered_utc']} "
            f"(sha256 {reg_sha}, {where}): "
            "the bar was edited after registration. " + honest(round_id)
        )


def registered(nominations_dir: str | os.PathLike, round_id: str) -> tuple[dict | None, str]:
    """(the round's registration in force, where it was read). Results from before the registry
    have only nominations/{round}.bar.json, which counts as the registration."""
    events, where = recorded(nominations_dir, round_id)
    return active(events), str(where)


def check_lost(nominations_dir: str | os.PathLike, round_id: str, rnd: dict) -> None:
    """The DAG's check that no registration of the round was deleted (registry.check_traces)."""
    events, where = recorded(nominations_dir, round_id)
    check_traces(nominations_dir, round_id, bar_sha256(bar.clauses(rnd)), events, where)


def record_registration(
    nominations_dir: str | os.PathLike,
    registry: Path,
    round_id: str,
    rnd: dict,
    legacy: dict | None = None,
    now: str | None = None,
) -> dict:
    """Register the round's bar unless the registry already holds it; return the entry in force.
    `legacy`: a registration written before the registry existed, adopted with its own time."""
    events, rec = read_registry(registry), register(round_id, rnd, now)
    backfill_journal(nominations_dir, round_id, events)
    adopt = bool(not events and legacy and legacy.get("round") == round_id)
    # before adopting: a .bar.json written over a deleted registry must not become the record
    held = events or ([legacy] if adopt else [])
    check_traces(nominations_dir, round_id, rec["bar_sha256"], held, registry)
    if adopt:
        kept = {k: v for k, v in legacy.items() if k not in ("registry", "retired")}
        adopted = {**kept, "event": "registered", "adopted": "from the .bar.json"}
        events = [record_event(nominations_dir, registry, adopted)]
    current = active(events)
    if current and current["bar_sha256"] != rec["bar_sha256"]:
        check_bar(round_id, rnd, current, str(registry))
    if current is None:
        current = record_event(nominations_dir, registry, {"event": "registered", **rec})
    retired = [e for e in read_registry(registry) if e["event"] == "retired"]
    return {**current, "registry": str(registry), "retired": retired}


def _time(s: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(s)
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def check_registration(
    round_id: str, rnd: dict, registration: dict, readout_times: dict[str, tuple[str, str]]
) -> None:
    """Raise RegistrationError unless the registered bar is the config's bar and was registered
    no later than every candidate readout; readout_times = {path: (utc iso, 'recorded'|'mtime')}."""
    if registration.get("round") != round_id:
        raise RegistrationError(
            f"round {round_id}: the registration is for round {registration.get('round')!r}"
        )
    sha, reg_sha, reg_at = (
        bar_sha256(bar.clauses(rnd)),
        registration["bar_sha256"],
        registration["registered_utc"],
    )
    if sha != reg_sha:
        raise RegistrationError(
            f"round {round_id}: refused. The bar in the config (sha256 {sha[:16]}...) "
            f"is not the bar registered at {reg_at} (sha256 {reg_sha[:16]}...): "
            "the bar was edited after registration. " + honest(round_id)
        )
    late = [
        (p, t, how) for p, (t, how) in sorted(readout_times.items()) if _time(t) < _time(reg_at)
    ]
    if late:
        p, t, how = min(late, key=lambda x: _time(x[1]))
        raise RegistrationError(
            f"round {round_id}: refused. The bar was registered at {reg_at}, "
            f"after {len(late)} of the {len(readout_times)} candidate readouts it judges were made "
            f"(e.g. {p}, created {t}, "
            f"{'recorded in the file' if how == 'recorded' else 'file mtime'}): "
            "the bar was registered after scoring, so it is not pre-registered. "
            "The registration stands; the candidates must be read out after it "
            "(e.g. `snakemake --forcerun readout`), "
            "or the bar given to a round registered before them."
        )


def check_against_registry(registration: dict, registry: Path) -> dict:
    """The registry's entry in force, which `registration` (the .bar.json) must be a copy of."""
    current = active(read_registry(registry))
    if current is None:
        raise RegistrationError(
            f"{registry}: no registration in force for round "
            f"{registration.get('round')!r}; `register` writes it"
        )
    theirs = (registration.get("bar_sha256"), registration.get("registered_utc"))
    if theirs != (current["bar_sha256"], current["registered_utc"]):
        raise RegistrationError(
            f"round {current['round']}: refused. The registration file "
            f"(bar sha256 {str(theirs[0])[:16]}..., registered {theirs[1]}) "
            f"is not the registry's (sha256 {current['bar_sha256'][:16]}..., "
            f"registered {current['registered_utc']}, {registry}): it was edited by hand."
        )
    return current


def readout_time(path: str) -> tuple[str, str]:
    from arenaflow.evals import readout_file  # pandas/pyarrow: only where readouts are read

    created = readout_file.readout_meta(path).get("created_utc")
    if created:
        return created, "recorded"
    mtime = dt.datetime.fromtimestamp(os.path.getmtime(path), dt.timezone.utc)
    return mtime.isoformat(timespec="microseconds"), "mtime"


# --- the seal -----------------------------------------------------------------------------


def digest(record: dict) -> str:
    """sha256 of the record as canonical JSON, without its own `digest`; through a JSON round
    trip first, so it is the same before writing and after reading (tuples become lists)."""
    body = json.loads(json.dumps({k: v for k, v in record.items() if k != "digest"}))
    return manifest.sha256_text(
        json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    )


def seal(record: dict, files: list[str]) -> dict:
    """The record with the sha256 of every file it was judged from, and its own digest."""
    out = {**record, "inputs": {p: manifest.sha256_file(p) for p in files}}
    return {**out, "digest": digest(out)}


def load_sealed(path: str | os.PathLike, root: str | os.PathLike | None = None) -> dict:
    """A nomination whose digest matches its content and whose promotion follows from its own
    verdicts; with `root`, every file it names (relative to root) must still have its sha256.
    Raises SealError naming what changed."""
    rec = io.read_json(path)
    how = (
        "`snakemake --forcerun nominate` judges the round again; "
        "a nomination is only written by `nominate judge`"
    )
    if "digest" not in rec or "inputs" not in rec:
        raise SealError(
            f"{path}: not sealed (no digest): "
            f"written by hand or before nominations were sealed; {how}"
        )
    if digest(rec) != rec["digest"]:
        raise SealError(
            f"{path}: edited after it was sealed: its content's sha256 {digest(rec)[:16]}... "
            f"is not its digest {rec['digest'][:16]}...; {how}"
        )
    if rec["promoted"] != promote(rec["candidates"], rec["incumbent"])[0]:
        raise SealError(
            f"{path}: promotes {rec['promoted']!r}, which its own verdicts do not; {how}"
        )
    for p, sha in ({} if root is None else rec["inputs"]).items():
        f = Path(root) / p
        now = manifest.sha256_file(f) if f.exists() else None
        if now != sha:
            raise SealError(
                f"{path}: {p}, which it judged, {'is gone' if now is None else 'changed'} "
                f"since the nomination was sealed (sha256 {sha[:16]}...); `snakemake "
                "--forcerun nominate` judges the round again on the files as they are"
            )
    return rec


# --- command line -------------------------------------------------------------------------


def _register_cmd(args, rnd: dict) -> None:
    out = Path(args.out)
    registry = Path(args.registry or registry_path(out.parent, args.round))
    # Snakemake keeps the output in place (update()): a .bar.json from before the registry
    legacy = io.read_json(out) if out.exists() else None
    rec = record_registration(out.parent, registry, args.round, rnd, legacy)
    io.write_json(out, rec)
    print(
        f"round {args.round}: bar sha256 {rec['bar_sha256']} "
        f"registered at {rec['registered_utc']} ({registry})"
    )
    power = rec.get("power") or {}
    for suite, p in power.get("suites", {}).items():
        mde = "unknown" if p["mde"] is None else f"{p['mde']:.3g} points"
        print(f"  {suite}: {p['n']} items, minimum detectable effect {mde}")
    for w in power.get("underpowered", []):
        print(f"WARNING (promotion.underpowered: warn): {w}", file=sys.stderr)


def _read_judged(args, rnd: dict) -> tuple[dict, dict]:
    compares = {}
    for path in args.compare:
        c = io.read_json(path)
        s, g = c.get("suite") or rnd["suite"], c.get("regime") or rnd["regime"]
        compares[(s, g, c["cand"], c["ref"])] = c
    noises = {}
    for path in args.noise:
        nz = io.read_json(path)
        noises[(nz["suite"], nz["regime"], nz["arm"])] = nz
    return compares, noises


def _judge_cmd(args, rnd: dict) -> None:
    settings = tracking.from_json(args.tracking_json)  # its backends imported as it judges
    registry = Path(args.registry or registry_path(Path(args.registration).parent, args.round))
    registration = io.read_json(args.registration)
    events = read_registry(registry)
    sha = bar_sha256(bar.clauses(rnd))
    check_traces(Path(args.registration).parent, args.round, sha, events, registry)
    current = check_against_registry(registration, registry)
    check_registration(args.round, rnd, current, {p: readout_time(p) for p in args.readouts})
    from arenaflow.evals import (
        compare as comparisons,  # compare/noise seals and pooled readouts' sha256 first
    )

    comparisons.verify_judged(args.compare, args.noise, args.readouts)
    result = nominate(args.round, rnd, *_read_judged(args, rnd), plan=current.get("power"))
    result["registration"] = {
        "path": args.registration,
        "registry": str(registry),
        "registered_utc": current["registered_utc"],
        "bar_sha256": current["bar_sha256"],
        "readouts_checked": len(args.readouts),
        "power": current.get("power"),  # the MDE plan registered with the bar (rounds.gate)
    }
    result = seal(result, [args.registration, *args.compare, *args.noise, *args.readouts])
    io.write_json(args.out, result)
    tracked.track(settings, result)
    for v in result["candidates"]:
        print(
            f"  {v['arm']}: delta {v['delta']:+.2f} W/L {v['wins']}/{v['losses']} -> "
            f"{'clears' if v['clears'] else 'fails clauses ' + str(v['failed'])}"
        )
    print(
        f"round {args.round}: promoted {result['promoted']} ({result['reason']}); "
        f"sealed {result['digest']}"
    )
    for w in (result.get("power_measured") or {}).get("underpowered_measured", []):
        print(f"WARNING (underpowered as measured; the decision stands): {w}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("register", help="record the round's bar, its sha256 and the time, once")
    j = sub.add_parser("judge", help="apply the registered bar; write the sealed nomination")
    v = sub.add_parser("verify", help="check a nomination's seal and the files it judged")
    v.add_argument("nomination")
    v.add_argument(
        "--root", default=".", help="where the paths it names start (the results directory)"
    )
    for p in (r, j):
        p.add_argument("--round", required=True, help="round id")
        p.add_argument("--round-json", required=True, help="the round's config section as JSON")
        p.add_argument("--registry", help="default: registry/{round}.jsonl beside the registration")
    r.add_argument("--out", required=True, help="nominations/{round}.bar.json")
    j.add_argument("--registration", required=True, help="nominations/{round}.bar.json")
    j.add_argument("--compare", nargs="+", required=True, help="compare JSONs the bar reads")
    j.add_argument("--noise", nargs="*", default=[], help="noise JSONs the bar reads")
    j.add_argument("--readouts", nargs="*", default=[], help="the candidates' readouts it judges")
    j.add_argument("--out", required=True, help="nominations/{round}.json")
    j.add_argument(
        "--tracking-json",
        default=None,
        help="config `tracking:` as resolved, JSON (arenaflow.tracking; default: none)",
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "verify":
            rec = load_sealed(args.nomination, root=args.root)
            print(
                f"OK {args.nomination}: digest {rec['digest']}, "
                f"{len(rec['inputs'])} judged files unchanged"
            )
        elif args.cmd == "register":
            _register_cmd(args, json.loads(args.round_json))
        else:
            _judge_cmd(args, json.loads(args.round_json))
    except (RegistrationError, SealError) as e:
        print(e, file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
