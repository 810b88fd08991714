"""The whole embedded default DAG through Snakemake on CPU, at the size of tests/e2e/config.yaml
(the `dag` tier: python -m pytest -m dag).

One module-scoped build (a few minutes on 2 cores) backs every test here: the dry run's whole
lineage (the LR sweep B1..B4), lineage 000's broken B3 template refused
(docs/lineages.md#000-the-b3-to-b3f-template-fix), bundles that differ only
in serving files, and a judged read. The properties every DAG must have (a bundle that reloads,
evidence, manifests, `touch`, config errors) are checked on the smallest DAG, in
test_dag_small.py, in the default tier.
"""

from __future__ import annotations

import json

import pytest
import scipy.stats
from dagrun import CONFIG, REPO, build, planned_jobs, snakemake

pytestmark = pytest.mark.dag


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory.mktemp("e2e"), CONFIG)


def test_dry_run_lists_the_whole_lineage(built):
    jobs = planned_jobs(built["dry"])
    rules = {r for r, _ in jobs}
    assert {
        "build_pool",
        "sample_candidates",
        "verify_candidates",
        "build_corpus",
        "train_arm",
        "readout_math",
        "compare",
        "nominate",
        "build_bundle",
    } <= rules
    trained = {wc.split("=")[1] for r, wc in jobs if r == "train_arm"}
    assert trained == {"S1", "R220", "R2d", "B1", "B2", "B3", "B4"}
    merged = {wc.split("=")[1] for r, wc in jobs if r == "merge_arm"}
    assert merged == {"soup", "dose-a0p5", "dose-a1p5", "dose-a2"}


def test_the_round_page_reads_the_dose_line_and_the_soup_with_k_replicates(built):
    """r3's report page: every merge read out as served K = 3 times (a noise floor each), and
    the merges page drawn."""
    res, arms = built["results"], built["arms"]
    snakemake("reports/r3/merges.png", results=res, arms=arms)
    assert (res / "reports/r3/merges.png").read_bytes()[:4] == b"\x89PNG"
    for arm in ("soup", "dose-a0p5", "dose-a1p5", "dose-a2"):
        noise = json.loads((res / f"noise/math/served/{arm}.json").read_text())
        assert noise["k"] == 3 and len(noise["replicate_accuracies"]) == 3
        c = json.loads((res / f"compare/math/served/{arm}__R2d.json").read_text())
        # the t over the 3 replicates is scipy's, and undefined only where the replicates' deltas
        # are all equal (no spread to divide by)
        deltas = c["replicate_deltas"]
        assert len(deltas) == 3
        if max(deltas) - min(deltas) > 1e-9:
            assert c["t"] == pytest.approx(scipy.stats.ttest_1samp(deltas, 0.0).statistic)
        else:
            assert c["t"] is None


def test_the_bundles_card_reads_the_lr_sweep_of_the_round_that_nominated_it(built):
    """B3f's card says why this learning rate, as lineage 000's does: round r3's sweep in LR
    order with its sealed numbers, and the reading (docs/lineages.md#000-the-lr-sweep)."""
    res = built["results"]
    card = (res / "bundles/B3f/README.md").read_text()
    nom = json.loads((res / "nominations/r3.json").read_text())
    section = card.split("## Why this learning rate")[1].split("\n## ")[0]
    rows = [line.split("\t") for line in section.splitlines() if line.startswith("B")]
    lrs = [["B2", "2.5e-04"], ["B1", "5e-04"], ["B3", "1e-03"], ["B4", "2.5e-03"]]
    assert [r[:2] for r in rows] == lrs  # config/arms/B*.yaml, in LR order
    sealed = {c["arm"]: c for c in nom["candidates"]}
    for arm, _lr, delta, wins_losses, _p in rows:
        c = sealed[arm]
        assert (delta, wins_losses) == (f"{c['delta']:+.2f}", f"{c['wins']}/{c['losses']}")
    assert "continue R2d on the corpus R2d sampled" in section
    verdicts = ("lies inside the sweep", "does not bracket its peak", "tie for the best")
    assert sum(v in section for v in verdicts) == 1, section
    served = nom["promoted"] in {r[0] for r in rows}
    assert served != (f"None of them was promoted: this bundle serves {nom['promoted']}" in section)


def test_the_b3_template_defect_fails_the_bundle_and_leaves_no_directory(built):
    proc = snakemake("bundles/B3", results=built["results"], arms=built["arms"], check=False)
    assert proc.returncode != 0
    log = (built["results"] / "logs/bundles/B3.log").read_text()
    assert "Encountered unknown tag 'raise_exception'" in log
    assert not (built["results"] / "bundles/B3").exists()
    assert not list((built["results"] / "bundles").glob(".B3.*")), "temporary directory left behind"


def test_a_bundle_differing_only_in_serving_files_retrains_nothing(built):
    from arenaflow.bundles import build as bundles

    res = built["results"]
    snakemake("bundles/B3g", results=res, arms=built["arms"])
    dry = snakemake("-n", "bundles/B3h", results=res, arms=built["arms"])
    assert {r for r, _ in planned_jobs(dry)} == {"build_bundle"}
    snakemake("bundles/B3h", results=res, arms=built["arms"])
    differ, same = bundles.diff(res / "bundles/B3g", res / "bundles/B3h")
    assert same, "weights differ between bundles of one arm"
    assert {"serving_config.json", "generation_config.json"} <= set(differ)
    assert not {"adapter_model.safetensors", "adapter_config.json", "chat_template.jinja"} & set(
        differ
    )


def test_a_judged_read_packs_the_bundles_readouts_and_unblinds_the_judges_csv(built, tmp_path):
    """config.yaml's judged read B3_vs_R2d: the packet comes from readouts the bundle already
    needed (only judged_pack runs), its key lies outside the judge's directory, and a judge's
    CSV named in config is unblinded into the comparison."""
    import yaml

    res, arms = built["results"], built["arms"]
    dry = snakemake("-n", "judged/B3_vs_R2d/pairs.jsonl", results=res, arms=arms)
    assert {r for r, _ in planned_jobs(dry)} == {"judged_pack"}
    proc = snakemake("-n", "judged/B3_vs_R2d.json", results=res, arms=arms, check=False)
    assert proc.returncode != 0 and "judged/B3_vs_R2d/scores" in proc.stdout + proc.stderr

    snakemake("judged/B3_vs_R2d/pairs.jsonl", results=res, arms=arms)
    assert [p.name for p in (res / "judged/B3_vs_R2d").iterdir()] == ["pairs.jsonl"]
    pairs = [json.loads(x) for x in (res / "judged/B3_vs_R2d/pairs.jsonl").read_text().splitlines()]
    key = json.loads((res / "judged/B3_vs_R2d.key.json").read_text())
    assert len(pairs) == 40 and {p["pair"] for p in pairs} == set(key["pairs"])
    assert key["arms"] == ["B3", "R2d"] and all("B3" not in json.dumps(p) for p in pairs)

    scores = tmp_path / "scores.csv"  # a judge who always prefers side A
    scores.write_text("pair,verdict\n" + "".join(f"{p['pair']},A\n" for p in pairs))
    read = {
        **yaml.safe_load((REPO / "config/config.yaml").read_text())["judged"]["B3_vs_R2d"],
        "scores": str(scores),
    }
    extra = tmp_path / "judged.yaml"
    extra.write_text(yaml.safe_dump({"judged": {"B3_vs_R2d": read}}))
    snakemake("judged/B3_vs_R2d.json", results=res, arms=arms, configfiles=(*CONFIG, extra))
    out = json.loads((res / "judged/B3_vs_R2d.json").read_text())
    sides = [k["A"] for k in key["pairs"].values()]
    assert (
        out["preferred"] == {"B3": sides.count("B3"), "R2d": sides.count("R2d")}
        and out["ties"] == 0
    )
