"""What a bundle serves and cites, read from runs/: a run's evidence and weight files.

Consumes runs/{arm}/final (training_evidence.json or merge_evidence.json, nominee.json) and the
corpora they name; gives the files to copy, the served arm's lineage on disk and its evidence,
and verifies every run, corpus and compare JSON before anything is read.
"""

from __future__ import annotations

from pathlib import Path

from arenaflow import io, manifest, models, paths

TRAINING, MERGE = "training_evidence.json", "merge_evidence.json"  # a trained arm's, a merge's
NOMINEE = (
    "nominee.json"  # a round's nominee's run: which arm it copied (arenaflow.rounds.continual)
)


def evidence_file(run_dir: Path) -> str:
    """The evidence a run carries: a trained arm's training evidence or a merge's."""
    return MERGE if (run_dir / MERGE).exists() else TRAINING


def weight_files(run_dir: Path) -> list[str]:
    """The files that carry an arm's weights: its adapter, or a full fine-tune's model files."""
    if models.is_adapter(run_dir):
        return list(models.ADAPTER_FILES)
    names = sorted(p.name for p in run_dir.glob("*.safetensors")) + ["config.json"]
    # not generation_config.json: the bundle writes its own from `serving:` (a full fine-tune's
    # run saves the base's, which the weights check then found "different")
    return names + [n for n in ("model.safetensors.index.json",) if (run_dir / n).exists()]


def evidence_corpora(evidence: dict) -> list[str]:
    """The corpora a trained arm's evidence names: its corpus, or each source of its mixture."""
    if "mixture" in evidence:
        return [s["corpus"] for s in evidence["mixture"]]
    return [evidence["corpus"]]


def disk_lineage(runs: Path, arm: str) -> list[str]:
    """`arm` and its ancestors, nearest first, as their runs record them: a trained arm's init,
    a merge's parents. A round's nominee (runs/{round}-nominee, arenaflow.rounds.continual) stands
    for
    the arm it copied, so the card names the arm whose weights these are, not every arm the
    round could have promoted (the config's lineage of an arm after a nominee)."""
    out, todo = [], [arm]
    while todo:
        a = real_arm(runs, todo.pop(0))
        if a == "base" or a in out:
            continue
        out.append(a)
        run = paths.run_under(runs, a)
        ev = io.read_json(run / evidence_file(run))
        todo += [p["arm"] for p in ev["parents"]] if "parents" in ev else [ev["init"]]
    return out


def real_arm(runs: Path, arm: str) -> str:
    """The arm a round's nominee copied (itself for any other arm)."""
    alias = paths.run_under(runs, arm) / NOMINEE
    return io.read_json(alias)["arm"] if alias.exists() else arm


def served_evidence(run_dir: Path, runs: Path) -> dict:
    """What the card and serving_config.json say of the served weights. A merge's base and
    method are its parents': read from the first trained arm among them, and the LoRA geometry
    from its own adapter_config.json."""
    if evidence_file(run_dir) == TRAINING:
        return io.read_json(run_dir / TRAINING)
    ev, parent = io.read_json(run_dir / MERGE), run_dir
    while evidence_file(parent) == MERGE:
        parent = paths.run_under(runs, io.read_json(parent / MERGE)["parents"][0]["arm"])
    trained = io.read_json(parent / TRAINING)
    hyper = {"method": "lora" if ev["output"] == "adapter" else "full", "objective": "merge"}
    if ev["output"] == "adapter":
        cfg = io.read_json(run_dir / models.ADAPTER_CONFIG)
        hyper["lora"] = {
            "r": cfg["r"],
            "alpha": cfg["lora_alpha"],
            "dropout": cfg["lora_dropout"],
            "target_modules": sorted(cfg["target_modules"]),
            "modules_to_save": cfg.get("modules_to_save") or [],
        }
    return {
        **ev,
        "base_model": trained["base_model"],
        "base_revision": trained["base_revision"],
        "hyperparameters": hyper,
    }


def verify_sources(args, arm: str, lineage: list[str]) -> None:
    """Everything a bundle copies or cites, verified before any of it is read: every run of the
    lineage (the served one's adapter and evidence are copied, the others' evidence is cited in
    the card), their corpora, and the sealed compare JSONs the card reports."""
    who, corpora = f"bundle {args.bundle}", set()
    for a in [arm, *lineage]:
        run = paths.run_under(args.runs, a)
        manifest.require(run, who)
        # a round's nominee (an arm's init or a corpus's policy) is a copy of an arm that the
        # lineage holds too: verified there, with its corpora
        if evidence_file(run) == TRAINING and not (run / NOMINEE).exists():
            corpora.update(evidence_corpora(io.read_json(run / TRAINING)))
    for c in sorted(corpora):
        manifest.require(Path(args.corpora) / c, who)
    for path in args.compare:
        manifest.check_seal(io.read_json(path), path)


def check_judged_weights(nomination: dict, arm: str, runs: Path, who: str) -> None:
    """Every readout of `arm` the nomination judged must have read the weights about to be
    served (the digest of runs/{arm}/final's manifest): a run retrained, restored or swapped in
    after its readouts would otherwise ship under numbers measured on other weights."""
    from arenaflow.evals.readout_file import readout_meta  # pyarrow: only when a bundle is built

    run = paths.run_under(runs, arm)
    digest = io.read_json(run / manifest.MANIFEST)["digest"]
    for path in nomination["inputs"]:
        named = paths.parse(paths.READOUT, path)
        if named is None or named["rarm"] != arm:
            continue
        read = (readout_meta(path).get("weights") or {}).get("manifest_digest")
        if read is not None and read != digest:
            raise manifest.ManifestError(
                f"{who} refused {run}: its manifest digest {digest} is not the {read} that "
                f"{path} read (the run changed after the readouts the nomination judged)"
            )
