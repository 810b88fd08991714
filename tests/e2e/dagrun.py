"""Running Snakemake on the embedded default in a test: one place for the command line and for
reading a dry run's plan, shared by the DAG tiers of tests/e2e."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = (REPO / "config/config.yaml", REPO / "tests/e2e/config.yaml")
MINI = (*CONFIG, REPO / "tests/e2e/mini.yaml")
# Every rule that bundles/B3f runs on the smallest DAG (mini.yaml)
STAGES = {
    "build_pool",
    "sample_candidates",
    "verify_candidates",
    "build_corpus",
    "train_arm",
    "merge_arm",
    "readout_math",
    "compare",
    "register_bar",
    "nominate",
    "build_bundle",
}


def command(
    *args: str, results: Path, arms: Path, configfiles: tuple[Path, ...] = CONFIG
) -> list[str]:
    """`python -m snakemake ARGS` on the embedded default: results and arms in the test's
    folders. ARGS come first: --configfile and --config take every word after them, up to the
    next option."""
    return [
        sys.executable,
        "-m",
        "snakemake",
        *args,
        "--configfile",
        *map(str, configfiles),
        "--config",
        f"results_dir={results}",
        f"arms_dir={arms}",
    ]


def dry_run(*args: str, results: Path, arms: Path, **kw) -> list[str]:
    """command's `snakemake -n ARGS`, killed after 300 s: a hung dry run fails its test."""
    return ["timeout", "-k", "10", "300", *command("-n", *args, results=results, arms=arms, **kw)]


def snakemake(
    *args: str,
    results: Path,
    arms: Path,
    check: bool = True,
    timeout: int = 1200,
    configfiles: tuple[Path, ...] = CONFIG,
):
    cmd = command(*args, "--cores", "2", results=results, arms=arms, configfiles=configfiles)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    return proc


def planned_blocks(out: str) -> list[tuple[str, str]]:
    """(rule, the job's block of text) of every job a dry run's output lists."""
    blocks = []
    for block in re.split(r"\n(?=(?:\[.*\]\n)?(?:local)?(?:rule|checkpoint) \w+:)", out):
        m = re.search(r"^(?:\[.*\]\n)?(?:local)?(?:rule|checkpoint) (\w+):", block)
        if m and m.group(1) != "all":
            blocks.append((m.group(1), block))
    return blocks


def planned_jobs(proc) -> list[tuple[str, str]]:
    """(rule, wildcards) of every job a dry run would run."""
    jobs = []
    for rule, block in planned_blocks(proc.stdout + proc.stderr):
        wc = re.search(r"wildcards: (.*)", block)
        jobs.append((rule, wc.group(1).strip() if wc else ""))
    return jobs


def planned_resources(cmd: list[str]) -> list[tuple[str, str, str]]:
    """Run a dry run (`cmd`) and give (rule, block, resources line) of every job it plans."""
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=330)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    return [
        (rule, block, re.search(r"resources: (.*)", block).group(1))
        for rule, block in planned_blocks(out)
    ]


def build(
    root: Path,
    configfiles: tuple[Path, ...],
    targets: tuple[str, ...] = ("bundles/B3f",),
    arms_from: Path = REPO / "config/arms",
) -> dict:
    """A dry run, then `targets`, in a results directory and an arms directory (a copy of
    `arms_from`) of their own (a test may edit the arm files)."""
    arms, results = root / "arms", root / "results"
    shutil.copytree(arms_from, arms)
    dry = snakemake("-n", *targets, results=results, arms=arms, configfiles=configfiles)
    run = snakemake(*targets, results=results, arms=arms, configfiles=configfiles)
    return {
        "root": root,
        "arms": arms,
        "results": results,
        "dry": dry,
        "run": run,
        "configfiles": configfiles,
    }


def serve_greedy(bundle: Path, base: Path, messages: list[dict], max_new_tokens: int):
    """Bundle `bundle` loaded as a server would (its tokenizer and chat template, its adapter on
    `base` through PEFT, its generation config's stop and pad ids) and `messages` answered
    greedily: (the tokenizer, the generation config, the answer's token ids)."""
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bundle)
    assert tok.chat_template == (bundle / "chat_template.jinja").read_text()
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), bundle)
    assert any("lora_" in n for n, _ in model.named_parameters()), "no LoRA weights reloaded"
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    gen = json.loads((bundle / "generation_config.json").read_text())
    out = model.generate(
        ids,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=gen["eos_token_id"],
        pad_token_id=gen["pad_token_id"],
    )
    return tok, gen, out[0, ids.shape[1] :]
