import os


def bundle_arm(wc):
    """The bundle's arm; for a round, read from the nomination once the checkpoint has run, and
    only from a sealed one whose judged files are unchanged (a hand edit stops the DAG here)."""
    b = CFG["bundles"][wc.bundle]
    if "arm" in b:
        return b["arm"]
    path = checkpoints.nominate.get(rnd=b["round"]).output[0]
    key = (path, os.stat(path).st_mtime_ns)
    if key not in SEALED:  # input functions run several times per job: hash the judged files once
        try:
            SEALED[key] = afnominate.load_sealed(path, root=".")["promoted"]
        except afnominate.SealError as e:
            raise WorkflowError(f"arenaflow: bundle {wc.bundle}: {e}") from None
    return SEALED[key]


SEALED = {}


def bundle_inputs(wc):
    b, served = CFG["bundles"][wc.bundle], bundle_arm(wc)
    lineage = [served, *CFG["arms"][served]["lineage"]]
    corpora = {CFG["arms"][a]["corpus"] for a in lineage}
    out = {
        "runs": [f"runs/{a}/final" for a in lineage],
        "corpora": [f"corpora/{c}/manifest.json" for c in sorted(corpora)],
        "compare": lineage_comparisons(served),
    }
    if "round" in b:
        out["nomination"] = f"nominations/{b['round']}.json"
    return out


def bundle_source(wc):
    b = CFG["bundles"][wc.bundle]
    return f"--nomination nominations/{b['round']}.json" if "round" in b else f"--arm {b['arm']}"


rule build_bundle:
    input:
        unpack(bundle_inputs),
        base=BASE_FILES,
    output:
        directory("bundles/{bundle}"),
    params:
        cfg=lambda wc: as_json(CFG["bundles"][wc.bundle]),
        source=bundle_source,
        # Before the round is judged (a dry run) the inputs are only the checkpoint's output.
        compare=lambda wc, input: input.get("compare", []),
        lineage=as_json({a: CFG["arms"][a]["lineage"] for a in ARM_IDS}),
        base=BASE,
        repo=str(REPO),
    log:
        "logs/bundles/{bundle}.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.bundles build --bundle {wildcards.bundle} {params.source} "
        "--lineage-json {params.lineage:q} --runs runs --corpora corpora --compare {params.compare} "
        "--base-model {params.base:q} --bundle-json {params.cfg:q} --repo-root {params.repo:q} "
        "--out {output} > {log} 2>&1"
