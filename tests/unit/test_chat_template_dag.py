"""A .jinja file as base.chat_template is an input of every job that renders with it (sampling,
corpora, training, readouts, bundles), so that editing the file reruns them; `own` and `chatml`
add no input (the base's own template is among its files)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from dagrun import MINI, REPO, dry_run, planned_blocks

from arenaflow import config
from arenaflow.dag import stages

# rft_r1 in 2 shards: its shard jobs render as the one job does; their merge renders nothing
RENDERING = {
    "sample_candidates",
    "sample_candidates_shard",
    "build_corpus",
    "train_arm",
    "readout_math",
    "build_bundle",
}


def test_only_a_template_file_is_an_input(repo_root):
    raw, files = config.load_configs([repo_root / "config/config.yaml"])
    cfg = config.resolve(raw, repo_root=repo_root, config_file="config.yaml", sources=files)
    assert stages.chat_template_file(cfg) == []  # own
    cfg["base"]["chat_template"] = "chatml"
    assert stages.chat_template_file(cfg) == []
    cfg["base"]["chat_template"] = "/x/t.jinja"
    assert stages.chat_template_file(cfg) == ["/x/t.jinja"]


@pytest.mark.dag  # a dry run of the smallest DAG: ~15 s on 2 cores
def test_every_rendering_job_reads_the_template_file(tmp_path):
    template = tmp_path / "house.jinja"
    shutil.copy(REPO / "tests/data/chat_templates/chatml.jinja", template)
    over = tmp_path / "over.yaml"
    over.write_text(f"base: {{chat_template: {template}}}\ncorpora: {{rft_r1: {{shards: 2}}}}\n")
    shutil.copytree(REPO / "config/arms", tmp_path / "arms")
    cmd = dry_run(results=tmp_path / "r", arms=tmp_path / "arms", configfiles=(*MINI, over))
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reads = {}
    for rule, block in planned_blocks(proc.stdout + proc.stderr):
        inputs = re.search(r"input: (.*)", block)
        reads.setdefault(rule, []).append(bool(inputs) and str(template) in inputs[1])
    assert RENDERING <= set(reads)
    assert all(all(reads[r]) for r in RENDERING), {r: reads[r] for r in RENDERING}
    assert not any(reads["verify_candidates"]) and not any(reads["compare"])
    assert not any(reads["merge_samples"])
