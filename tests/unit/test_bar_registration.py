"""A round's registered bar cannot be replaced by deleting its registration
(arenaflow.rounds.registry): the journal and the round's nomination still record it, and
`register`, `judge` and the DAG check refuse a registry that lost it, naming the file and both
bars' sha256; `python -m arenaflow.rounds.reregister` is the one, logged, way to change a bar."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest
import yaml
from test_nominate import LOOSER, Round, refused, snapshot

from arenaflow import io
from arenaflow.rounds import bar, nominate, registry, reregister

REASON = "W-L of 3 was a typo"


def noms(r: Round) -> Path:
    return r.dir / "nominations"


def sha(rnd: dict) -> str:
    return nominate.bar_sha256(bar.clauses(rnd))


def delete_registration(r: Round) -> None:
    """What the hostile user did: the round's registry and its .bar.json removed."""
    registry.registry_path(noms(r), "r3").unlink()
    Path(r.reg).unlink()


def events(r: Round) -> list[dict]:
    return io.read_jsonl(registry.registry_path(noms(r), "r3"))


def test_a_deleted_registration_is_refused_naming_the_journal(tmp_path, capsys):
    """The probe: registry and .bar.json deleted, a new bar registered, the readouts remade."""
    r = Round(tmp_path)
    r.register()
    r.score()
    old, looser = io.read_json(r.reg)["bar_sha256"], {**r.rnd, "bar": LOOSER}
    delete_registration(r)
    before = snapshot(r)
    refused(r.register, looser)
    err = capsys.readouterr().err
    assert (
        "journal.jsonl records that r3's bar" in err and "registry/r3.jsonl does not exist" in err
    )
    assert old in err and sha(looser) in err
    assert "python -m arenaflow.rounds.reregister --round r3" in err
    assert snapshot(r) == before  # no registry and no .bar.json written
    with pytest.raises(nominate.RegistrationError, match=f"journal.jsonl .*{sha(looser)}"):
        nominate.check_lost(noms(r), "r3", looser)  # what rules/nominate.smk runs first
    refused(r.register)  # the same bar again: its registration time is lost all the same


def test_with_the_journal_deleted_too_the_nomination_is_the_evidence(tmp_path, capsys):
    r = Round(tmp_path)
    r.register()
    r.score()
    first = r.judge()
    delete_registration(r)
    (noms(r) / "journal.jsonl").unlink()
    looser = {**r.rnd, "bar": LOOSER}
    refused(r.register, looser)
    err = capsys.readouterr().err
    assert "r3.json records that r3's bar" in err
    assert first["registration"]["bar_sha256"] in err and sha(looser) in err
    assert not registry.registry_path(noms(r), "r3").exists()


def test_a_registry_written_over_the_deleted_one_is_refused_by_judge(tmp_path, capsys):
    """The probe without `register`: a registry and a .bar.json for the new bar written in place
    of the deleted ones, the readouts made again after them."""
    r = Round(tmp_path)
    r.register()
    r.score()
    old, looser = io.read_json(r.reg)["bar_sha256"], {**r.rnd, "bar": LOOSER}
    delete_registration(r)
    forged = {"event": "registered", **registry.register("r3", looser)}
    registry.append(registry.registry_path(noms(r), "r3"), forged)
    io.write_json(r.reg, forged)
    r.score()  # --forcerun readout: every readout postdates the forged registration
    refused(r.judge, looser)
    err = capsys.readouterr().err
    assert "journal.jsonl records that r3's bar" in err and old in err
    assert f"holds only a registration of bar sha256 {sha(looser)}" in err
    assert not (noms(r) / "r3.json").exists()
    with pytest.raises(nominate.RegistrationError, match="journal.jsonl"):
        nominate.check_lost(noms(r), "r3", looser)


def test_a_bar_json_written_over_a_deleted_registry_is_not_adopted(tmp_path, capsys):
    r = Round(tmp_path)
    r.register()
    looser = {**r.rnd, "bar": LOOSER}
    registry.registry_path(noms(r), "r3").unlink()
    io.write_json(r.reg, registry.register("r3", looser))  # as if from before the registry
    refused(r.register, looser)
    assert "journal.jsonl records that r3's bar" in capsys.readouterr().err
    assert not registry.registry_path(noms(r), "r3").exists()


def test_the_normal_path_keeps_the_journal_and_judges_as_before(tmp_path):
    r = Round(tmp_path)
    r.register()
    r.register()
    r.score()
    first = r.judge()
    assert r.judge()["digest"] == first["digest"]  # its own earlier nomination is no trace
    assert io.read_jsonl(noms(r) / "journal.jsonl") == events(r) and len(events(r)) == 1
    nominate.check_lost(noms(r), "r3", r.rnd)
    registry.registry_path(noms(r), "r3").unlink()  # the registry alone: the .bar.json adopted
    r.register()
    assert events(r)[0]["registered_utc"] == first["registration"]["registered_utc"]
    assert r.judge()["promoted"] == first["promoted"]


def test_a_registry_from_before_the_journal_is_copied_into_it(tmp_path, capsys):
    r = Round(tmp_path)
    r.register()
    (noms(r) / "journal.jsonl").unlink()  # results written before the journal
    r.register()
    assert io.read_jsonl(noms(r) / "journal.jsonl") == events(r)
    delete_registration(r)
    refused(r.register, {**r.rnd, "bar": LOOSER})
    assert "journal.jsonl records that r3's bar" in capsys.readouterr().err


def test_reregister_is_logged_and_judgement_then_uses_the_new_bar(tmp_path, capsys):
    r = Round(tmp_path)
    r.register()
    r.score()
    first, looser = r.judge(), {**r.rnd, "bar": LOOSER}
    new = registry.reregister(noms(r), "r3", looser, REASON, "alice")
    assert [e["event"] for e in events(r)] == ["registered", "retired", "registered"]
    retired = events(r)[1]
    assert retired["bar_sha256"] == first["registration"]["bar_sha256"] == sha(r.rnd)
    assert retired["registered_utc"] == first["registration"]["registered_utc"]
    assert retired["retired_utc"] == new["registered_utc"] and new["bar_sha256"] == sha(looser)
    assert (
        retired["reason"] == new["reason"] == REASON and retired["user"] == new["user"] == "alice"
    )
    assert io.read_jsonl(noms(r) / "journal.jsonl") == events(r)
    r.register(looser)  # what register_bar does next: the new entry copied out
    assert io.read_json(r.reg)["bar_sha256"] == sha(looser)
    assert io.read_json(r.reg)["retired"] == [retired]
    nominate.check_lost(noms(r), "r3", looser)  # the DAG checks pass on the new bar
    nominate.check_bar("r3", looser, *nominate.registered(noms(r), "r3"))
    refused(r.judge, looser)  # the readouts predate the new registration
    assert "after 2 of the 2 candidate readouts" in capsys.readouterr().err
    r.score()
    out = r.judge(looser)
    assert out["registration"]["bar_sha256"] == sha(looser)
    assert {c["clauses"][1]["threshold"] for c in out["candidates"]} == {2}
    refused(r.register)  # the old bar is now the edited one
    assert len(events(r)) == 3


def test_reregister_after_a_deletion_retires_what_the_traces_record(tmp_path):
    r = Round(tmp_path)
    r.register()
    r.score()
    r.judge()
    old, looser = io.read_json(r.reg)["bar_sha256"], {**r.rnd, "bar": LOOSER}
    delete_registration(r)
    registry.reregister(noms(r), "r3", looser, "registry lost; bar corrected", "bob")
    assert [(e["event"], e["bar_sha256"]) for e in events(r)] == [
        ("retired", old),
        ("registered", sha(looser)),
    ]
    r.register(looser)
    nominate.check_lost(noms(r), "r3", looser)


def test_reregister_refuses_without_a_registration_a_change_or_a_reason(tmp_path):
    r = Round(tmp_path)
    looser = {**r.rnd, "bar": LOOSER}
    with pytest.raises(registry.RegistrationError, match="nothing to re-register"):
        registry.reregister(noms(r), "r3", looser, REASON, "alice")
    r.register()
    with pytest.raises(registry.RegistrationError, match="is the bar registered at"):
        registry.reregister(noms(r), "r3", r.rnd, REASON, "alice")
    with pytest.raises(registry.RegistrationError, match="needs a --reason"):
        registry.reregister(noms(r), "r3", looser, "  ", "alice")
    assert [e["event"] for e in events(r)] == ["registered"]


def test_the_reregister_command_reads_the_config_and_logs_the_user(tmp_path, capsys):
    """The command as a user runs it: the round's bar from the config files, as Snakemake
    resolves them."""
    from arenaflow import config as afconfig
    from arenaflow import schema

    results = tmp_path / "results"
    edit = tmp_path / "bar.yaml"
    edit.write_text(yaml.safe_dump({"rounds": {"r3": {"bar": LOOSER}}}))

    def round_json(*configfiles) -> dict:
        raw, files = afconfig.load_configs(configfiles, [f"results_dir={results}"])
        cfg = afconfig.resolve(raw, config_file=afconfig.files_label(files))
        return json.loads(schema.stage_json(cfg["rounds"]["r3"]))

    rnd, new = round_json(), round_json(edit)
    n = results / "nominations"
    reg = n / "r3.bar.json"
    nominate.main(["register", "--round", "r3", "--round-json", json.dumps(rnd), "--out", str(reg)])
    argv = ["--round", "r3", "--configfile", str(edit), "--config", f"results_dir={results}"]
    assert reregister.main([*argv, "--reason", REASON]) == 0
    assert f"bar sha256 {sha(new)} registered at" in capsys.readouterr().out
    *_, retired, registered = io.read_jsonl(registry.registry_path(n, "r3"))
    assert (retired["event"], retired["bar_sha256"]) == ("retired", sha(rnd))
    assert registered["bar_sha256"] == io.read_json(reg)["bar_sha256"] == sha(new)
    assert retired["user"] == registered["user"] == getpass.getuser()
    assert registered["reason"] == REASON
    nominate.check_bar("r3", new, *nominate.registered(n, "r3"))
    nominate.check_lost(n, "r3", new)
    assert reregister.main([*argv, "--reason", REASON]) == 1  # already the registered bar
    assert "nothing to re-register" in capsys.readouterr().err
    assert reregister.main([*argv[:1], "r9", *argv[2:], "--reason", REASON]) == 1
    assert "no round 'r9' under rounds" in capsys.readouterr().err
