"""arenaflow.paths: the one layout of the workflow's outputs (rules' `output:` and src agree)."""

from arenaflow import paths


def test_functions_format_the_rule_patterns():
    assert paths.readout("math", "B3", "greedy", 0) == "readouts/math/B3/greedy.r0.parquet"
    assert paths.compare("math", "served", "B3", "R2d") == "compare/math/served/B3__R2d.json"
    assert paths.noise("math", "served", "R2d") == "noise/math/served/R2d.json"
    assert paths.run("B3") == "runs/B3/final"
    assert paths.pool("math_eval") == "pools/math_eval.jsonl"
    assert paths.corpus("C1") == "corpora/C1"
    assert paths.registration("r3") == "nominations/r3.bar.json"
    assert paths.nomination("r3") == "nominations/r3.json"
