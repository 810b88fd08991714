"""The smallest DAG that runs every rule (tests/e2e/mini.yaml) through Snakemake on CPU: the
default test tier's end-to-end check (about 2 minutes on 2 cores).

One module-scoped build backs every test: the dry run's lineage, the bundle that reloads as a
server would, evidence that matches the corpus, every manifest, the `touch` semantics, and a
config error that stops `snakemake -n`.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from dagrun import MINI, REPO, STAGES, build, planned_jobs, serve_greedy, snakemake


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory.mktemp("e2e_small"), MINI)


def test_dry_run_lists_every_stage_and_the_lineage(built):
    jobs = planned_jobs(built["dry"])
    assert STAGES <= {r for r, _ in jobs}
    assert {wc.split("=")[1] for r, wc in jobs if r == "train_arm"} == {"S1", "R220", "R2d", "B3"}
    assert {wc for r, wc in jobs if r == "merge_arm"} == {"arm=dose-a1p5"}


def served(built) -> tuple[str, str]:
    """(the arm round r3 promoted, its evidence file: a merge's or a trained arm's)."""
    arm = json.loads((built["results"] / "nominations/r3.json").read_text())["promoted"]
    return arm, "merge_evidence.json" if arm.startswith("dose") else "training_evidence.json"


def test_bundle_reloads_as_a_server_would(built):
    bundle = built["results"] / "bundles/B3f"
    for f in (
        "adapter_model.safetensors",
        "adapter_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
        "serving_config.json",
        "system_prompt.txt",
        served(built)[1],
        "README.md",
        "manifest.json",
        "reload_check.json",
    ):
        assert (bundle / f).is_file(), f
    assert json.loads((bundle / "reload_check.json").read_text())["verdict"] == "RELOAD_CHECK_PASS"
    question = "Ann has 12 pens and gets 30 more. How many pens now?"
    _, gen, answer = serve_greedy(
        bundle, REPO / "models/tiny-arith", [{"role": "user", "content": question}], 48
    )
    assert answer[-1].item() in gen["eos_token_id"], (
        "greedy generation did not stop on a stop token"
    )


def test_evidence_matches_corpus_and_every_manifest_verifies(built):
    from arenaflow import manifest

    res = built["results"]
    bundle = res / "bundles/B3f"
    arm, evidence_file = served(built)
    dirs = [bundle, *(res / "runs").glob("*/final"), *(res / "corpora").glob("*")]
    for d in dirs:
        manifest.verify(d)
    assert (bundle / "adapter_model.safetensors").read_bytes() == (
        res / "runs" / arm / "final/adapter_model.safetensors"
    ).read_bytes()
    for a in {"B3", "R2d", arm} - {"dose-a1p5"}:  # every trained arm r3 read names its corpus
        evidence = json.loads((res / "runs" / a / "final/training_evidence.json").read_text())
        corpus = res / "corpora" / evidence["corpus"]
        assert evidence["arm"] == a
        assert (
            evidence["dataset_sha256"]
            == json.loads((corpus / "manifest.json").read_text())["digest"]
        )
    merged = json.loads((res / "runs/dose-a1p5/final/merge_evidence.json").read_text())
    weights = {p["arm"]: p["weight"] for p in merged["parents"]}
    assert weights == {"R2d": -0.5, "B3": 1.5}  # R2d + 1.5 (B3 - R2d)
    for p in merged["parents"]:
        run = manifest.verify(res / "runs" / p["arm"] / "final")["files"]
        assert {f: run[f]["sha256"] for f in p["files_sha256"]} == p["files_sha256"]
    assert json.loads((bundle / evidence_file).read_text()) == json.loads(
        (res / "runs" / arm / "final" / evidence_file).read_text()
    )


def touched_plan(built, arm_file: str) -> list[tuple[str, str]]:
    os.utime(built["arms"] / arm_file)
    try:
        return planned_jobs(
            snakemake(
                "-n", "bundles/B3f", results=built["results"], arms=built["arms"], configfiles=MINI
            )
        )
    finally:
        # leave the build consistent for the other tests: mark every output up to date again
        snakemake(
            "--touch", "bundles/B3f", results=built["results"], arms=built["arms"], configfiles=MINI
        )


def test_touching_an_arm_reruns_exactly_it_and_its_descendants(built):
    jobs = touched_plan(built, "B3.yaml")
    assert {wc for r, wc in jobs if r == "train_arm"} == {"arm=B3"}
    assert {wc for r, wc in jobs if r == "merge_arm"} == {"arm=dose-a1p5"}  # B3 is on its line
    assert {r for r, _ in jobs} <= {
        "train_arm",
        "merge_arm",
        "readout_math",
        "compare",
        "nominate",
        "build_bundle",
    }
    readouts = {wc for r, wc in jobs if r == "readout_math"}
    assert all("rarm=B3" in wc or "rarm=dose-a1p5" in wc for wc in readouts) and readouts
    assert ("build_bundle", "bundle=B3f") in jobs


def test_touching_a_merge_reruns_the_merge_and_nothing_it_is_made_of(built):
    jobs = touched_plan(built, "dose.yaml")
    assert ("merge_arm", "arm=dose-a1p5") in jobs
    assert not {r for r, _ in jobs} & {"train_arm", "sample_candidates", "build_corpus"}
    assert all("rarm=dose-a1p5" in wc for r, wc in jobs if r == "readout_math")


def test_a_bad_arm_value_stops_the_dry_run_naming_file_and_key(built, tmp_path):
    arms = tmp_path / "arms"
    shutil.copytree(built["arms"], arms)
    (arms / "B3.yaml").write_text("init: R2d\ncorpus: rft_r3\nhyper: {lr: -1.0e-4}\n")
    proc = snakemake(
        "-n", "bundles/B3f", results=tmp_path / "r", arms=arms, check=False, configfiles=MINI
    )
    assert proc.returncode != 0
    msg = proc.stdout + proc.stderr
    assert "B3.yaml" in msg and "hyper/lr" in msg, msg[-3000:]
    assert not (tmp_path / "r" / "pools").exists(), "a job ran despite the config error"


def test_resource_and_selection_keys_rerun_no_gpu_job_and_lr_reruns_the_chain(built, tmp_path):
    """Only keys that change results are rule params: a training job's resources and checkpoint
    cadence rerun nothing, a corpus's selection keys rebuild the corpus without resampling on
    the GPU, and a learning rate reruns the arms that use it and their descendants."""
    import yaml

    def plan(edit: dict) -> list[tuple[str, str]]:
        extra = tmp_path / "edit.yaml"
        extra.write_text(yaml.safe_dump(edit))
        return planned_jobs(
            snakemake(
                "-n",
                "bundles/B3f",
                results=built["results"],
                arms=built["arms"],
                configfiles=(*MINI, extra),
            )
        )

    assert (
        plan({"train_defaults": {"runtime_min": 45, "mem_mb": 5000, "checkpoint_every": 3}}) == []
    )
    jobs = plan({"corpora": {"rft_r3": {"select": "shortest", "min_chars": 2}}})
    assert ("build_corpus", "corpus=rft_r3") in jobs
    assert not {r for r, _ in jobs} & {"sample_candidates", "verify_candidates"}
    trained = {wc for r, wc in plan({"train_defaults": {"lr": 5.0e-4}}) if r == "train_arm"}
    assert trained == {"arm=R220", "arm=R2d", "arm=B3"}  # S1 and B3 set their own lr; B3 descends
    # a regime's decoding, and the serving block a regime reads out as served, rerun the readouts
    # of every arm the bundle's lineage reads, then what judges and cites them
    read = {wc for r, wc in plan({}) if r == "readout_math"}
    assert read == set()
    for edit in (
        {"evals": {"math": {"regimes": {"greedy": {"max_new_tokens": 40}}}}},
        {"bundles": {"B3f": {"serving": {"temperature": 0.5}}}},
    ):
        jobs = plan(edit)
        read = {wc for r, wc in jobs if r == "readout_math"}
        assert {"rarm=B3", "rarm=R2d", "rarm=dose-a1p5"} <= read, (edit, jobs)
        assert ("build_bundle", "bundle=B3f") in jobs and not {r for r, _ in jobs} & {
            "train_arm",
            "sample_candidates",
        }


# A result-changing key of each rule family -> (jobs that must rerun, rules that must not).
RERUNS = [
    (
        {"pools": {"math_r3": {"seed": 15}}},
        {("build_pool", "pool=math_r3"), ("sample_candidates", "corpus=rft_r3")},
        set(),  # everything downstream of the pool reruns
    ),
    (
        {"corpora": {"rft_r3": {"temperature": 0.6}}},
        {("sample_candidates", "corpus=rft_r3"), ("train_arm", "arm=B3")},
        {"build_pool"},
    ),
    (
        {"corpora": {"rft_r3": {"decontaminate": False}}},
        {("build_corpus", "corpus=rft_r3"), ("train_arm", "arm=B3")},
        {"build_pool", "sample_candidates", "verify_candidates"},
    ),
    (
        {"train_defaults": {"lora": {"r": 4}}},  # every arm's, S1's too: its corpus resamples
        {
            ("train_arm", "arm=S1"),
            ("sample_candidates", "corpus=rft_r1"),
            ("merge_arm", "arm=dose-a1p5"),
        },
        {"build_pool"},
    ),
    (
        {"evals": {"math": {"seed": 1}}},
        {("readout_math", "rarm=B3"), ("build_bundle", "bundle=B3f")},
        {"train_arm", "build_corpus", "sample_candidates"},
    ),
    (
        {"evals": {"math": {"engine": {"decoder": "static"}}}},
        {("readout_math", "rarm=B3")},
        {"train_arm", "build_corpus", "sample_candidates"},
    ),
    (
        {"bundles": {"B3f": {"reload_prompts": ["What is 2 + 2?"]}}},
        {("build_bundle", "bundle=B3f")},
        {"train_arm", "readout_math", "compare", "nominate"},
    ),
]


@pytest.mark.dag  # seven dry runs, ~1 min: in CI's tiers, not the README's test command
def test_each_result_changing_key_reruns_its_jobs_and_nothing_upstream(built, tmp_path):
    """One key of each rule family edited at a time on the built mini DAG: the dry run plans
    the jobs whose output depends on it (Snakemake's params trigger) and none upstream."""
    import yaml

    extra = tmp_path / "edit.yaml"
    for edit, must, never in RERUNS:
        extra.write_text(yaml.safe_dump(edit))
        jobs = planned_jobs(
            snakemake(
                "-n",
                "bundles/B3f",
                results=built["results"],
                arms=built["arms"],
                configfiles=(*MINI, extra),
            )
        )
        assert must <= set(jobs), (edit, jobs)
        assert not {r for r, _ in jobs} & never, (edit, jobs)


def test_check_finds_no_stale_output_and_names_each_one_an_edit_leaves(built, tmp_path):
    """`python -m arenaflow.config.check`: on the build as made, every recorded setting is the
    config's; with lr, a regime's decoding and a corpus's selection edited (what `snakemake
    --touch` would then leave looking current), it names each output made otherwise and exits 1."""
    import subprocess
    import sys

    import yaml

    def check(*extra) -> subprocess.CompletedProcess:
        config = [f"results_dir={built['results']}", f"arms_dir={built['arms']}"]
        return subprocess.run(
            [sys.executable, "-m", "arenaflow.config.check", "--configfile", *map(str, MINI),
             *extra, "--config", *config],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    clean = check()
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
    edit = tmp_path / "edit.yaml"
    edit.write_text(
        yaml.safe_dump(
            {
                "train_defaults": {"lr": 5.0e-4},
                "evals": {"math": {"regimes": {"greedy": {"max_new_tokens": 40}}}},
                "corpora": {"rft_r3": {"select": "shortest"}},
            }
        )
    )
    proc = check(str(edit))
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-3000:]
    assert "runs/R2d/final/training_evidence.json hyperparameters: lr recorded 0.001" in out
    assert "readouts/math/B3/greedy.r0.parquet: decoding recorded" in out
    assert (
        "corpora/rft_r3/manifest.json: select recorded 'median', the config has 'shortest'" in out
    )
    assert "runs/S1/final" not in out  # S1 sets its own lr


def test_an_edited_bar_or_nomination_stops_the_dag_and_every_record_stays(built, tmp_path):
    """Custody probes through Snakemake: r3's bar edited, with --forcerun nominate or readout,
    is refused before any job runs, and the registration, the registry and the nomination stay
    byte for byte; so is the edited bar with the registry and the .bar.json deleted (the journal
    records the registration); the bar put back, nothing is left to do; a hand-edited `promoted`
    stops the DAG; the bundle's model card cites the seal."""
    import yaml

    res, noms = built["results"], built["results"] / "nominations"
    records = [noms / "r3.bar.json", noms / "r3.json", noms / "registry/r3.jsonl"]
    records.append(noms / "journal.jsonl")
    state = lambda: {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in records}  # noqa: E731
    before = state()
    edit = tmp_path / "bar.yaml"
    edit.write_text(
        yaml.safe_dump(
            {"rounds": {"r3": {"bar": [{"metric": "delta", "op": ">", "value": -100.0}]}}}
        )
    )
    for forced in ("nominate", "readout_math"):
        proc = snakemake(
            "bundles/B3f",
            "--forcerun",
            forced,
            results=res,
            arms=built["arms"],
            check=False,
            configfiles=(*MINI, edit),
        )
        msg = proc.stdout + proc.stderr
        assert (
            proc.returncode != 0
            and "round r3: refused" in msg
            and "python -m arenaflow.rounds.reregister --round r3" in msg
        ), msg[-3000:]
        assert state() == before
    gone = records[0], records[2]
    for p in gone:
        p.unlink()
    try:
        proc = snakemake(
            "bundles/B3f",
            "--forcerun",
            "readout_math",
            results=res,
            arms=built["arms"],
            check=False,
            configfiles=(*MINI, edit),
        )
        msg = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "journal.jsonl records that r3's bar" in msg, msg[-3000:]
        assert not any(p.exists() for p in gone)
    finally:  # as they were, mtimes included
        for p in gone:
            p.parent.mkdir(exist_ok=True)
            p.write_bytes(before[p][0])
            os.utime(p, ns=(before[p][1],) * 2)
    assert state() == before
    assert (
        planned_jobs(
            snakemake("-n", "bundles/B3f", results=res, arms=built["arms"], configfiles=MINI)
        )
        == []
    )
    nom = json.loads((noms / "r3.json").read_text())
    try:
        (noms / "r3.json").write_text(
            json.dumps({**nom, "promoted": "B3" if nom["promoted"] != "B3" else "R2d"})
        )
        proc = snakemake(
            "-n", "bundles/B3f", results=res, arms=built["arms"], check=False, configfiles=MINI
        )
        assert (
            proc.returncode != 0
            and "r3.json: edited after it was sealed" in proc.stdout + proc.stderr
        )
    finally:  # as it was, mtime included, for the tests after this one
        (noms / "r3.json").write_bytes(before[noms / "r3.json"][0])
        os.utime(noms / "r3.json", ns=(before[noms / "r3.json"][1],) * 2)
    card = (res / "bundles/B3f/README.md").read_text()
    assert f"digest `{nom['digest']}`" in card and nom["bar_sha256"][:16] in card


def test_the_report_after_the_main_job_is_written_where_asked(built, tmp_path):
    """`snakemake --report report.html` right after bundles/B3f (which builds no round page)
    works, and writes into the directory it was started in, not into results/."""
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "--report",
        "report.html",
        "--cores",
        "1",
        "--configfile",
        *map(str, MINI),
        "--config",
        f"results_dir={built['results']}",
        f"arms_dir={built['arms']}",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert (tmp_path / "report.html").stat().st_size > 0
    assert not (built["results"] / "report.html").exists()
    assert "round r3's page is not built yet" in proc.stdout + proc.stderr


def test_a_flipped_adapter_bit_fails_its_readout_and_changes_nothing_downstream(built, tmp_path):
    """A custody probe: one flipped bit in runs/B3/final's adapter (its mtime kept, as a disk
    error would), then B3's greedy readout made again on the way to the bundle. The readout job
    fails naming the file; no compare, nomination or bundle is rewritten. Then all is put back.
    The readout is forced (--forcerun): merely deleted, Snakemake leaves it missing here, since
    the nomination that read it is complete and up to date (B3 is not the served arm)."""
    import re

    res = built["results"]
    adapter = res / "runs/B3/final/adapter_model.safetensors"
    readout = res / "readouts/math/B3/greedy.r0.parquet"
    log = res / "logs/readouts/math/B3.log"
    downstream = [
        res / "compare/math/greedy/B3__R2d.json",
        res / "nominations/r3.json",
        *sorted(p for p in (res / "bundles/B3f").rglob("*") if p.is_file()),
    ]
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in downstream}
    raw, mtime = bytearray(adapter.read_bytes()), adapter.stat().st_mtime_ns
    shutil.copy2(readout, tmp_path / "readout.parquet")
    try:
        raw[-1] ^= 1
        adapter.write_bytes(raw)
        os.utime(adapter, ns=(mtime, mtime))
        log.unlink()  # so the log read below is this run's
        # mtime alone: only the probe's jobs, whatever else changes in the checkout meanwhile
        proc = snakemake(
            "bundles/B3f",
            "--rerun-triggers",
            "mtime",
            "--forcerun",
            str(readout.relative_to(res)),
            results=res,
            arms=built["arms"],
            check=False,
            configfiles=MINI,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Error in rule readout" in out, out[-4000:]
        assert not re.search(r"^(local)?rule (train_arm|compare|build_bundle):", out, re.M), out[
            -4000:
        ]
        assert re.search(
            r"readout refused runs/B3/final: runs/B3/final/adapter_model\.safetensors: "
            r"sha256 \w+ does not match the manifest's",
            log.read_text(),
        ), log.read_text()[-2000:]
        # update(): Snakemake put back the readout it had set aside for the failed job
        assert readout.read_bytes() == (tmp_path / "readout.parquet").read_bytes()
        assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in downstream} == before
    finally:  # the byte, the mtime and the readout as they were, for any test after this one
        raw[-1] ^= 1
        adapter.write_bytes(raw)
        os.utime(adapter, ns=(mtime, mtime))
        readout.parent.mkdir(parents=True, exist_ok=True)  # Snakemake removed it once empty
        shutil.copy2(tmp_path / "readout.parquet", readout)
    assert (
        planned_jobs(
            snakemake(
                "-n",
                "bundles/B3f",
                "--rerun-triggers",
                "mtime",
                results=res,
                arms=built["arms"],
                configfiles=MINI,
            )
        )
        == []
    )


def test_a_failed_bundle_rebuild_keeps_the_good_bundle(built):
    """A rebuild of bundles/B3f that fails (its served run's adapter refused after a flipped bit)
    leaves the previous bundle whole: every file as it was and its manifest verifying. Without
    update() on the rule's output Snakemake deletes the bundle before the job and again after
    it fails."""
    from arenaflow import manifest

    res = built["results"]
    arm, _ = served(built)
    bundle = res / "bundles/B3f"
    adapter = res / "runs" / arm / "final/adapter_model.safetensors"
    before = {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()}
    raw, mtime = bytearray(adapter.read_bytes()), adapter.stat().st_mtime_ns
    try:
        raw[-1] ^= 1
        adapter.write_bytes(raw)
        os.utime(adapter, ns=(mtime, mtime))
        proc = snakemake(
            "bundles/B3f",
            "--rerun-triggers",
            "mtime",
            "--forcerun",
            "build_bundle",
            results=res,
            arms=built["arms"],
            check=False,
            configfiles=MINI,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Error in rule build_bundle" in out, out[-4000:]
        assert "Restored previous version" in out, out[-4000:]
        assert {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()} == before
        manifest.verify(bundle)
    finally:
        raw[-1] ^= 1
        adapter.write_bytes(raw)
        os.utime(adapter, ns=(mtime, mtime))


def test_a_merge_arm_is_bundled_and_reloads_as_a_trained_arm_is(built):
    """bundles/Bdose serves dose-a1p5 (tests/e2e/mini.yaml): the merged adapter byte for byte,
    its merge evidence, a card that lists the merge, a reload that passes."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    res = built["results"]
    snakemake("bundles/Bdose", results=res, arms=built["arms"], configfiles=MINI)
    bundle, run = res / "bundles/Bdose", res / "runs/dose-a1p5/final"
    assert (bundle / "adapter_model.safetensors").read_bytes() == (
        run / "adapter_model.safetensors"
    ).read_bytes()
    assert json.loads((bundle / "merge_evidence.json").read_text())["representation"].startswith(
        "concatenated rank"
    )
    checks = json.loads((bundle / "checks.json").read_text())
    assert (
        checks["evidence"]["verdict"] == "PASS"
        and "-0.5 x R2d + 1.5 x B3" in checks["evidence"]["detail"]
    )
    card = (bundle / "README.md").read_text()
    assert "Merge `dose-a1p5` = base + -0.5 x R2d + 1.5 x B3" in card
    assert json.loads((bundle / "reload_check.json").read_text())["verdict"] == "RELOAD_CHECK_PASS"
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(REPO / "models/tiny-arith"), bundle
    )
    assert model.peft_config["default"].r == 16  # R2d's rank 8 and B3's, concatenated


def test_tensorboard_holds_a_run_per_trained_arm_with_its_steps_and_the_round(built):
    """The embedded default's tracker: results/tensorboard/<lineage>/<arm> for every trained arm,
    its loss at each of its steps (metrics.jsonl's), beside the sampling, readout and round
    runs; read back with tensorboard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    res = built["results"]
    (lineage,) = (res / "tensorboard").iterdir()
    assert lineage.name == res.name  # tracking/lineage's default

    def scalars(run: str) -> dict:
        acc = EventAccumulator(str(lineage / run), size_guidance={"scalars": 0})
        acc.Reload()
        return {t: [e.step for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}

    for arm in ("S1", "R220", "R2d", "B3"):
        metrics = (res / "runs" / arm / "final/metrics.jsonl").read_text().splitlines()
        steps = [json.loads(m)["step"] for m in metrics]
        got = scalars(arm)
        assert got["train/loss"] == steps and got["train/lr/lora"] == steps, arm
    assert "verify/pass@1" in scalars("corpora/rft_r1/verify")
    assert "sample/tokens_per_s" in scalars("corpora/rft_r1/sample")
    assert any(t.endswith("/accuracy_ci95_low") for t in scalars("B3/readouts/math"))
    assert "round/delta" in scalars("r3/B3") and "round/cleared" in scalars("r3")
