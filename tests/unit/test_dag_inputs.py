"""arenaflow.dag: what each rule's job reads and is passed, from the embedded default's resolved
config, without Snakemake: the lineage a bundle cites, the launch of an arm's ranks, the flags of
a merge and a mixture, a suite's readout plan, and the continual walk's stop rules."""

import json

import pytest

from arenaflow import config, paths, schema
from arenaflow.dag import rounds, stages


@pytest.fixture(scope="module")
def cfg(repo_root):
    raw, files = config.load_configs([repo_root / "config/config.yaml"])
    return config.resolve(raw, repo_root=repo_root, config_file="config.yaml", sources=files)


def test_a_bundle_cites_every_run_corpus_and_comparison_of_its_lineage(cfg):
    got = stages.bundle_inputs(cfg, "B3f", "B3")
    lineage = ["B3", *cfg["arms"]["B3"]["lineage"]]
    assert lineage[:2] == ["B3", "R2d"] and "base" not in lineage
    assert got["runs"] == [paths.run(a) for a in lineage]
    trained_on = {c for a in lineage for c in cfg["arms"][a]["mix"]}
    assert got["corpora"] == [paths.corpus_manifest(c) for c in sorted(trained_on)]
    # each arm of the lineage against its own init, in every regime of every suite
    want = {
        paths.compare(s, g, a, cfg["arms"][a]["init"])
        for a in lineage
        for s, suite in cfg["evals"].items()
        for g in suite["regimes"]
    }
    assert set(got["compare"]) == want and len(got["compare"]) == len(want)
    assert got["nomination"] == paths.nomination("r3") and "prompt_search" not in got


def test_an_arm_s_ranks_start_as_its_hyper_says():
    assert stages.launcher({"nproc": 1, "nodes": 1}) == "python"
    assert stages.launcher({"nproc": 4, "nodes": 1}) == ("torchrun --standalone --nproc_per_node 4")
    two = stages.launcher({"nproc": 2, "nodes": 3})
    assert two.startswith("srun --nodes 3 --ntasks-per-node 1 ") and two.endswith(
        "arenaflow.train.launch --nproc-per-node 2"
    )


def test_merge_and_mixture_flags_keep_the_config_s_order(cfg):
    soup = cfg["arms"]["soup"]
    dirs = stages.merge_parents(soup)
    assert dirs == [paths.run(a) for a in soup["merge"]["weights"]]
    flags = stages.merge_flags(soup, dirs)
    assert flags == " ".join(
        f"--parent {a}={paths.run(a)}:{w!r}" for a, w in soup["merge"]["weights"].items()
    )
    assert stages.mix_flags(cfg["arms"]["B3"], "B3.yaml") == ""  # one corpus, named by id
    arm = {"corpus": "b:10,a:all", "mix": {"b": 10, "a": "all"}}
    assert (
        stages.mix_flags(arm, "x.yaml") == """--mix-json '{"b":10,"a":"all"}' --arm-file x.yaml"""
    )


def test_a_suite_s_readout_plan_holds_each_regime_and_replicate_once(cfg):
    reads = stages.suite_reads(cfg, "math")
    outs = [paths.readout("math", "B3", g, r) for g, r in reads]
    assert outs == [o.format(rarm="B3") for o in stages.suite_readouts(cfg, "math")]
    plan = json.loads(stages.readout_plan(cfg, "math", "B3"))
    assert [(p["regime"], p["replicate"], p["out"]) for p in plan] == [
        (g, r, o) for (g, r), o in zip(reads, outs)
    ]
    for p in plan:  # only the decoding keys the regime sets; the system turn resolved
        regime = cfg["evals"]["math"]["regimes"][p["regime"]]
        assert p["decoding"] == {k: regime[k] for k in schema.DECODING_KEYS if k in regime}
        assert p["system_prompt"] == cfg["system_prompt"]
    assert (
        sum(1 for p in plan if p["regime"] == "served")
        == (cfg["evals"]["math"]["regimes"]["served"]["replicates"])
    )


def test_the_continual_walk_stops_after_rounds_that_kept_their_incumbent(cfg):
    template = [r for r in cfg["rounds"] if r not in rounds.declared_rounds(cfg)]
    assert template == ["r4", "r5"]
    asked = []

    def kept(rnd):  # every round keeps its incumbent
        asked.append(rnd)
        return paths.nomination(rnd), {"promoted": cfg["rounds"][rnd]["incumbent"]}

    walk = rounds.continual_walk(cfg, "r5", kept, lambda rnd: None)
    assert walk == {"nominations": [paths.nomination("r4"), paths.nomination("r5")], "note": ""}
    assert asked == ["r4", "r5"]
    refused = rounds.continual_walk(cfg, "r5", kept, lambda rnd: f"no budget for {rnd}")
    assert refused == {"nominations": [], "note": "no budget for r4"}
    declared = rounds.continual_walk(cfg, "r3", kept, lambda rnd: None)
    assert declared == {"nominations": [paths.nomination("r3")], "note": ""}


def test_a_round_s_page_reads_every_regime_and_each_judged_arm_s_noise(cfg):
    got = rounds.round_report_inputs(cfg, "r3")
    r3 = cfg["rounds"]["r3"]
    regimes = cfg["evals"]["math"]["regimes"]
    assert len(got["compare"]) == len(regimes) * len(r3["candidates"])
    noisy = [g for g, reg in regimes.items() if reg["replicates"] >= 2]
    assert len(got["noise"]) == len(noisy) * (1 + len(r3["candidates"]))
    assert got["runs"] == [paths.run(a) for a in [r3["incumbent"], *r3["candidates"]]]
