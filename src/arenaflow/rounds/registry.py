"""A round's registration record, the append-only registry that holds it, and the traces that
make the registry's deletion visible.

registry_path is nominations/registry/{round}.jsonl; its events are "registered" and "retired",
and the registration in force is the last one registered and not retired since. Every event is
appended to the round's registry and then to the journal, nominations/journal.jsonl (every
round's events, outside nominations/registry/); neither is a Snakemake output.

No rule deletes the registry, but a user can. Were a missing registry simply a new round, the
bar could be replaced after the readouts were seen: delete the registry and the .bar.json,
register another bar, force the readouts, and they would postdate the new registration. So a
registration must account for every trace of an earlier one: the journal's registration in
force for the round, and the one the round's sealed nomination (nominations/{round}.json, an
update() output that survives until the round is judged again) was judged under. A trace the
registry holds neither as registered nor as retired refuses `register`, `judge` and the DAG
check (check_traces), naming the file that records it and both bars' sha256. The one way to
change a registered round's bar is reregister (`python -m arenaflow.rounds.reregister`): a
"retired" event for the registration in force and for every trace the registry lost, then a
"registered" event for the new bar, each with the reason, the user and the time. Registries
written before the journal are copied into it the first time `register` sees the round.
These are the user's own files, so this detects the deletion of the round's registry and
.bar.json (or a registry written in their place), not of every record: deleting the journal and
the nomination as well leaves no trace.

Refusing a changed bar is arenaflow.rounds.nominate's check_bar.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from arenaflow import io, manifest
from arenaflow.rounds import bar, gate
from arenaflow.rounds.bar import bar_sha256


class RegistrationError(RuntimeError):
    pass


def reregister_hint(round_id: str) -> str:
    return (
        f"python -m arenaflow.rounds.reregister --round {round_id} --reason '<why>' "
        "[--configfile ...] (logged in the registry)"
    )


def utcnow() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")


def check_power(round_id: str, rnd: dict) -> dict | None:
    """The bar's power plan (arenaflow.rounds.gate); RegistrationError naming the round, suite
    and clause when a clause asks for less than its suite detects and promotion.underpowered
    is `refuse`."""
    plan = gate.power_plan(round_id, rnd)
    if plan and plan["underpowered"] and plan["on_underpowered"] == "refuse":
        raise RegistrationError(
            f"{plan['underpowered'][0]}. Refused at registration: ask for at least the MDE, add "
            "a p_value clause on the suite, enlarge the suite, or set promotion.underpowered: "
            f"warn to register it with a warning ({len(plan['underpowered'])} clause(s))"
        )
    return plan


def register(round_id: str, rnd: dict, now: str | None = None) -> dict:
    """The registration record of a round's bar (not yet in any registry), with its power plan;
    an underpowered bar is refused (check_power)."""
    resolved = bar.clauses(rnd)
    plan = check_power(round_id, rnd)
    rec = {
        "round": round_id,
        "bar": rnd["bar"],
        "bar_resolved": resolved,
        "bar_sha256": bar_sha256(resolved),
        # as written (gating: what config resolution added, recorded as `power`)
        "round_config": {k: v for k, v in rnd.items() if k not in ("bar_resolved", "gating")},
        "registered_utc": now or utcnow(),
        "code": manifest.code_version(),
    }
    if plan:  # with promotion.underpowered: warn, its `underpowered` are the warnings
        rec["power"] = plan
    return rec


def registry_path(nominations_dir: str | os.PathLike, round_id: str) -> Path:
    return Path(nominations_dir) / "registry" / f"{round_id}.jsonl"


def journal_path(nominations_dir: str | os.PathLike) -> Path:
    return Path(nominations_dir) / "journal.jsonl"


def read_registry(path: str | os.PathLike) -> list[dict]:
    return io.read_jsonl(path) if Path(path).exists() else []


def recorded(nominations_dir: str | os.PathLike, round_id: str) -> tuple[list[dict], Path]:
    """(the round's registry events, the file they were read from). Results from before the
    registry have only nominations/{round}.bar.json, which counts as the one registration."""
    path = registry_path(nominations_dir, round_id)
    events = read_registry(path)
    legacy = Path(nominations_dir) / f"{round_id}.bar.json"
    if not events and legacy.exists():
        return [io.read_json(legacy)], legacy
    return events, path


def active(events: list[dict]) -> dict | None:
    """The registration in force: the last one registered and not retired since."""
    current = None
    for e in events:
        if e.get("event", "registered") == "registered":
            current = e
        elif e["event"] == "retired" and current and e["bar_sha256"] == current["bar_sha256"]:
            current = None
    return current


def append(path: Path, event: dict) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(event, sort_keys=True, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return event


def record(nominations_dir: str | os.PathLike, registry: Path, event: dict) -> dict:
    """Append to the registry, then the journal: an event only the registry holds (a crash
    between the two) is harmless, one only the journal holds would refuse the round."""
    append(registry, event)
    return append(journal_path(nominations_dir), event)


def backfill_journal(nominations_dir: str | os.PathLike, round_id: str, events: list[dict]):
    """Copy a registry written before the journal into it; once the journal knows the round,
    only record() writes it, so a registry rewritten by hand cannot make itself the record."""
    journal = journal_path(nominations_dir)
    if events and not any(e.get("round") == round_id for e in read_registry(journal)):
        for e in events:
            append(journal, e)


def _key(e: dict) -> tuple:
    return e.get("bar_sha256"), e.get("registered_utc")


def traces(nominations_dir: str | os.PathLike, round_id: str, events: list[dict]) -> list:
    """[(the file, the registration it records)] for every earlier registration of the round
    that `events` (the registry) hold neither as registered nor as retired."""
    found = []
    journal = journal_path(nominations_dir)
    kept = active([e for e in read_registry(journal) if e.get("round") == round_id])
    if kept:
        found.append((str(journal), kept))
    nomination = Path(nominations_dir) / f"{round_id}.json"
    judged = io.read_json(nomination).get("registration") if nomination.exists() else None
    if judged and judged.get("bar_sha256"):
        found.append((str(nomination), judged))
    held = {_key(e) for e in events}
    return [(p, reg) for p, reg in found if _key(reg) not in held]


def check_traces(
    nominations_dir: str | os.PathLike,
    round_id: str,
    config_sha: str,
    events: list[dict],
    where: str | os.PathLike,
) -> None:
    """Raise RegistrationError naming the first trace that `events`, read from `where`, lost."""
    lost = traces(nominations_dir, round_id, events)
    if not lost:
        return
    path, reg = lost[0]
    current = active(events)
    state = (
        "does not exist"
        if not Path(where).exists()
        else "is empty"
        if not events
        else f"holds only a registration of bar sha256 {current['bar_sha256']} "
        f"registered {current['registered_utc']}"
        if current
        else "holds no registration in force"
    )
    raise RegistrationError(
        f"round {round_id}: refused. {path} records that {round_id}'s bar (sha256 "
        f"{reg['bar_sha256']}) was registered at {reg['registered_utc']}, but {where} {state}; "
        f"the config's bar has sha256 {config_sha}. The registration was deleted or replaced, "
        "which would let a bar chosen after the readouts pass as pre-registered. Put "
        f"{registry_path(nominations_dir, round_id)} back as it was, or change the bar "
        f"explicitly: {reregister_hint(round_id)}"
    )


def reregister(
    nominations_dir: str | os.PathLike,
    round_id: str,
    rnd: dict,
    reason: str,
    user: str,
    now: str | None = None,
) -> dict:
    """Retire the round's registration in force and every one its registry lost (traces), then
    register `rnd`'s bar; every event carries the reason, the user and the time. Returns the
    new registration."""
    events, where = recorded(nominations_dir, round_id)
    registry = registry_path(nominations_dir, round_id)
    if not reason.strip():
        raise RegistrationError(f"round {round_id}: a re-registration needs a --reason")
    current, lost = active(events), [reg for _, reg in traces(nominations_dir, round_id, events)]
    retire = list({_key(r): r for r in [*([current] if current else []), *lost]}.values())
    rec = register(round_id, rnd, now)
    if not retire:
        raise RegistrationError(
            f"round {round_id}: nothing to re-register: {where} holds no registration in force "
            "and nothing records one; the workflow's register_bar registers the bar"
        )
    if not lost and current["bar_sha256"] == rec["bar_sha256"]:
        raise RegistrationError(
            f"round {round_id}: the config's bar (sha256 {rec['bar_sha256']}) is the bar "
            f"registered at {current['registered_utc']} ({where}); nothing to re-register"
        )
    log = {"reason": reason, "user": user}
    for old in retire:
        record(
            nominations_dir,
            registry,
            {
                "event": "retired",
                "round": round_id,
                "bar_sha256": old["bar_sha256"],
                "registered_utc": old["registered_utc"],
                "retired_utc": rec["registered_utc"],
                **log,
            },
        )
    return record(nominations_dir, registry, {"event": "registered", **rec, **log})
