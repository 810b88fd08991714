# A round's registered bar never changes (arenaflow.rounds.nominate), and a deleted registry does
# not make the round new (arenaflow.rounds.registry). Checked here, while the DAG is built, so an
# edited bar or a lost registration stops even `snakemake -n` before any job starts: Snakemake
# records the params a job ran with even when it fails, so a refused job would leave the edit
# looking current.
for _rid, _rnd in CFG["rounds"].items():
    _noms = REPO / CFG["results_dir"] / "nominations"
    try:
        afnominate.check_lost(_noms, _rid, _rnd)
        afnominate.check_bar(_rid, _rnd, *afnominate.registered(_noms, _rid))
    except afnominate.RegistrationError as e:
        raise WorkflowError(f"arenaflow: {e}") from None


# The bar, its sha256 and a UTC time, from the round's config alone (no inputs), so it is
# written before the readouts it judges: priority puts it first among the jobs ready at start.
# The registry (not an output: Snakemake never deletes it) keeps the first registration of each
# round; a rerun copies it out again, with its original time. Only
# `python -m arenaflow.rounds.reregister` changes it. update(): a refused job leaves
# the previous file in place instead of deleting it.
rule register_bar:
    output:
        update(afpaths.REGISTRATION),
    log:
        "logs/nominations/{rnd}.bar.log",
    priority: 100
    localrule: True
    conda:
        "../envs/arenaflow.yaml"
    params:
        cfg=lambda wc: as_json(CFG["rounds"][wc.rnd]),
        registry=lambda wc: afpaths.registry(wc.rnd),
    shell:
        "python -m arenaflow.rounds.nominate register --round {wildcards.rnd} --round-json {params.cfg:q} "
        "--registry {params.registry} --out {output} > {log} 2>&1"


# A checkpoint: which arm a bundle serves is known only once the round has been judged. The
# nomination is sealed (the sha256 of everything it judged, and its own digest); update(): a
# refused judgement leaves the previous nomination in place.
checkpoint nominate:
    input:
        registration=afpaths.REGISTRATION,
        compare=lambda wc: afrounds.round_needs(CFG, wc.rnd)["compare"],
        noise=lambda wc: afrounds.round_needs(CFG, wc.rnd)["noise"],
        readouts=lambda wc: afrounds.round_needs(CFG, wc.rnd)["readouts"],
    output:
        update(afpaths.NOMINATION),
    log:
        "logs/nominations/{rnd}.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        tracking=TRACKING,
        cfg=lambda wc: as_json(CFG["rounds"][wc.rnd]),
        registry=lambda wc: afpaths.registry(wc.rnd),
    shell:
        "python -m arenaflow.rounds.nominate judge --round {wildcards.rnd} --round-json {params.cfg:q} "
        "--registration {input.registration} --registry {params.registry} "
        "--compare {input.compare} --noise {input.noise} --readouts {input.readouts} --out {output} {params.tracking} > {log} 2>&1"
