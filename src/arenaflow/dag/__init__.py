"""The DAG's inputs and parameters, computed from a resolved config: what each rule's job reads
and is passed. rules/*.smk wire these into Snakemake (wildcards in, paths and flags out); the
logic is here, where it can be tested without Snakemake."""
