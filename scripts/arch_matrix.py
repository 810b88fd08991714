"""Architecture matrix: tiny random models of ten architectures, each the base of
config/examples/own-model.yaml run through Snakemake (candidates sampled from the base and
verified, a corpus, a LoRA and a full fine-tuning arm, readouts decoded from each, a round and a
bundle with its reload check), or refused
before any job with an error naming the architecture and what it lacks.

    nice -n 10 python scripts/arch_matrix.py --out arch_matrix.json
    nice -n 10 python scripts/arch_matrix.py --archs llama,phi3 --workdir /tmp/m --out m.json

No download: every model is built here from a transformers config (hidden 64, 2 layers) with
the embedded default's byte-level ChatML tokenizer (arenaflow.bases.tinymodel), warmed on the
example pool's worked solutions just until its greedy answers end (a bundle whose answers never
stop fails its reload check); the example trains on those solutions, so no arm needs a model that
solves prompts (rejection sampling from a random model keeps no row). Each row also samples k
answers per prompt from its base on a few training prompts and verifies each (SAMPLING), a corpus
no arm trains on. Prints a table
(arch, result, seconds, refusal) and writes it as JSON; exits 1 if an architecture neither ran
nor was refused before any job.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config/examples/own-model.yaml"

# Candidate sampling and verification, which the example's `policy: reference` corpus never runs:
# a corpus of the matrix's own overlay sampled from the base on a few training prompts. No arm
# trains on it (rejection sampling from a random model may keep no row); its verdicts are a
# target, so every row samples k answers per prompt and verifies each.
SAMPLED = "sampled"
PROBE_POOL = {"file": "data/examples/gsm8k-train.jsonl", "n": 4, "seed": 3}
SAMPLING = {"pool": "probe", "policy": "base", "k": 2, "temperature": 0.8, "max_new_tokens": 16}
SAMPLES = f"candidates/{SAMPLED}/samples.jsonl"  # arenaflow.paths.SAMPLES
VERDICTS = f"candidates/{SAMPLED}/verdicts.jsonl"  # arenaflow.paths.VERDICTS
TARGETS = ("nominations/r1.json", "bundles/lora", VERDICTS)

# Every size the architectures share; each entry adds what its config needs beyond them
# (head_dim where the default would not divide 64 by 4 heads, the MoE's experts, the hybrid's
# Mamba mixer). Phi-3 and GPT-NeoX rotate part of each head, as Phi-4-mini and Pythia do.
SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)
ARCHS = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "mistral": {"head_dim": 16},
    "gemma2": {"head_dim": 16},
    "gemma3_text": {"head_dim": 16},
    "phi3": {"partial_rotary_factor": 0.5},
    "gpt_neox": {"rotary_pct": 0.25, "num_key_value_heads": None},
    "qwen3_moe": {
        "head_dim": 16,
        "moe_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
    "falcon_h1": {
        "head_dim": 16,
        "mamba_d_ssm": 64,
        "mamba_n_heads": 4,
        "mamba_d_head": 16,
        "mamba_d_state": 16,
        "mamba_n_groups": 1,
    },
}

# LoRA targets where the example's all-linear does not build a bundle, as a user of such a base
# would set them: on Qwen3-MoE, PEFT's all-linear also adapts the fused experts' 3-D parameters
# (target_parameters), which arenaflow's merge into merged/ (needed by every engine for such an
# adapter) cannot fold; on a Mamba hybrid, PEFT refuses the mixer's out_proj and conv1d.
TARGETS_OF = {
    "qwen3_moe": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "falcon_h1": ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj"],
}

# Each row of the matrix: (model_type, LoRA targets). The two all-linear rows must be refused
# before any job, by the config check (arenaflow.bases.lora_refusal).
MATRIX = {a: (a, TARGETS_OF.get(a, ["all-linear"])) for a in ARCHS} | {
    "qwen3_moe-all-linear": ("qwen3_moe", ["all-linear"]),
    "falcon_h1-all-linear": ("falcon_h1", ["all-linear"]),
}


def build(arch: str, tokenizer, seed: int = 0):
    """A random model of `arch` (a transformers model_type) sized for `tokenizer`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from arenaflow import chat

    kw = {**SIZES, **ARCHS[arch]}
    kw = {k: v for k, v in kw.items() if v is not None}
    cfg = AutoConfig.for_model(
        arch,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids(chat.IM_END),
        bos_token_id=None,
        **kw,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg)


def stops(model, tokenizer, prompts: list[str], max_new_tokens: int) -> bool:
    """Whether greedy answers to every prompt are non-empty and end on a stop token in time."""
    from arenaflow.decode import sampling

    dec = sampling.Decoding(temperature=0.0, max_new_tokens=max_new_tokens)
    outs = sampling.generate(model, tokenizer, prompts, dec, k=1, seed=0, desc="warm-up check")
    return all(o[0]["text"].strip() and o[0]["stopped"] for o in outs)


def warm(model, tokenizer, example: dict, args) -> int:
    """Train `model` on the example's training pool's worked solutions until greedy answers to
    its bundle's reload prompts stop, and still stop after as many steps again (the reload check
    refuses a bundle whose answer never ends, which a random model's never does); the steps it
    took."""
    import torch

    from arenaflow import chat
    from arenaflow.bases import tinymodel
    from arenaflow.pools.imported import import_rows

    pool = {"kind": "math", **example["pools"]["train"]}
    rows = import_rows("train", pool, root=REPO)
    system = example["system_prompt"]
    encoded = [
        chat.encode_with_mask(
            tokenizer,
            chat.prompt_messages(system, r["prompt"])
            + [{"role": "assistant", "content": r["reference"]}],
        )
        for r in rows
    ]
    bundle = example["bundles"]["lora"]
    prompts = [chat.render(chat.prompt_messages(system, p), True) for p in bundle["reload_prompts"]]
    rng = random.Random(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    budget, first = bundle["serving"]["max_new_tokens"], None
    for step in range(1, args.max_steps + 1):
        tinymodel._step(model, opt, tokenizer, rng.sample(encoded, args.batch_size))
        if step % args.check_every == 0 and (first is None or step >= 2 * first):
            model.eval()
            if stops(model, tokenizer, prompts, budget):
                if first is not None:
                    return step
                # as many steps again: a model that has only just learnt to stop may stop no
                # more after the arms' few steps of training (Gemma 3 did not)
                first = step
    raise RuntimeError(f"warm-up: answers still do not stop after {args.max_steps} steps")


def make_base(arch: str, out: Path, args) -> int:
    """The model of `arch`, warmed, saved with the embedded default's tokenizer in `out`; the
    warm-up's steps."""
    import yaml

    from arenaflow import io
    from arenaflow.bases import tinymodel

    tok = tinymodel.build_tokenizer()
    model = build(MATRIX[arch][0], tok, args.seed)
    steps = warm(model, tok, yaml.safe_load(EXAMPLE.read_text()), args)
    with io.atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return steps


def overlay(arch: str, base: Path, root: Path) -> Path:
    """A config file merged over the example: the tiny base, a results directory, the row's
    LoRA targets and the sampled corpus (SAMPLING) with its pool."""
    cfg = {
        "base": {"name": f"tiny/{arch}", "path": str(base)},
        "results_dir": str(root / "results" / arch),
        "pools": {SAMPLING["pool"]: PROBE_POOL},
        "corpora": {SAMPLED: SAMPLING},
    }
    cfg["train_defaults"] = {"lora": {"target_modules": MATRIX[arch][1]}}
    path = root / f"{arch}.yaml"
    path.write_text(json.dumps(cfg))  # YAML reads JSON
    return path


def snakemake_cmd(*args: str, files: tuple[Path, ...], cores: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "snakemake",
        *args,
        "--cores",
        str(cores),
        "--configfile",
        *map(str, files),
    ]


def refusal(out: str) -> str:
    """The line of a failed run that says why (arenaflow's errors name the file and key)."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    for word in ("config error", "refused", "Error"):  # Snakemake's own "WorkflowError in" last
        if said := [ln for ln in lines if word in ln]:
            return said[0]
    return lines[-1] if lines else ""


def run_arch(arch: str, root: Path, args) -> dict:
    """Build, warm and save one architecture's base, then run the example on it; the row."""
    t0 = time.time()
    row = {"arch": arch, "lora_targets": MATRIX[arch][1]}
    try:
        row["warm_steps"] = make_base(arch, root / "bases" / arch, args)
    except Exception as e:  # a model transformers cannot build here: a row, not a crash
        return row | {"result": "broken", "seconds": round(time.time() - t0, 1), "error": repr(e)}
    row["warm_s"] = round(time.time() - t0, 1)
    files = (EXAMPLE, overlay(arch, root / "bases" / arch, root))
    if args.fork_server:
        files = (*files, _fork_overlay(root, args.fork_server))
    proc = subprocess.run(
        snakemake_cmd(*TARGETS, files=files, cores=args.cores),
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    log = root / f"{arch}.snakemake.log"
    log.write_text(proc.stdout + proc.stderr)
    row |= {"seconds": round(time.time() - t0, 1), "log": str(log)}
    if proc.returncode == 0:
        results = root / "results" / arch
        checks = json.loads((results / "bundles/lora/checks.json").read_text())
        row["checks"] = {k: c["verdict"] for k, c in checks.items()}
        return row | {"result": "ran", "sampled": sampled(results)}
    # Snakemake prints "rule <name>:" as it starts a job: a failure before the first one is a
    # refusal at DAG-build time (the config's and the base's checks)
    started = re.search(r"^(local)?rule \w+:", proc.stdout + proc.stderr, re.M)
    if started:
        return row | {"result": "failed", "error": refusal(proc.stdout + proc.stderr)}
    return row | {"result": "refused", "refusal": refusal(proc.stdout + proc.stderr)}


def sampled(results: Path) -> dict:
    """What the sampled corpus's jobs wrote: samples per prompt, and verdicts per sample."""
    from arenaflow import io

    samples = io.read_jsonl(results / SAMPLES)
    verdicts = io.read_jsonl(results / VERDICTS)
    per_prompt: dict[str, int] = {}
    for s in samples:
        per_prompt[s["prompt_id"]] = per_prompt.get(s["prompt_id"], 0) + 1
    judged = {v["id"] for v in verdicts}
    return {
        "samples_per_prompt": per_prompt,
        "unjudged": sorted(s["id"] for s in samples if s["id"] not in judged),
        "correct": sum(bool(v["correct"]) for v in verdicts),
        "verdicts": len(verdicts),
    }


def _fork_overlay(root: Path, socket: str) -> Path:
    path = root / "fork_server.yaml"
    path.write_text(json.dumps({"fork_server": socket}))
    return path


@contextlib.contextmanager
def fork_server(root: Path):
    """arenaflow.zygote's server on a socket in `root` for the matrix's jobs: each job forks
    from it instead of importing torch and transformers anew (10-13 s a job)."""
    sock, log = root / "af.sock", root / "zygote.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "arenaflow.zygote", "serve", "--socket", str(sock)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:
        deadline = time.time() + 300
        while "serving on" not in log.read_text():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the fork server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield str(sock)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def table(rows: list[dict]) -> str:
    out = [f"{'arch':<22} {'result':<8} {'seconds':>8} {'warm-up s':>9}  refusal"]
    for r in rows:
        why = r.get("refusal") or r.get("error") or ""
        warm = f"{r['warm_s']:>9.1f}" if "warm_s" in r else f"{'':>9}"
        out.append(f"{r['arch']:<22} {r['result']:<8} {r['seconds']:>8.1f} {warm}  {why}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="arch_matrix.json", help="the matrix as JSON")
    ap.add_argument("--archs", default=",".join(MATRIX), help="comma-separated rows (MATRIX)")
    ap.add_argument("--workdir", help="bases and results (default: a new temporary directory)")
    ap.add_argument("--parallel", type=int, default=2, help="architectures run at once")
    ap.add_argument("--cores", type=int, default=1, help="Snakemake's --cores per architecture")
    ap.add_argument(
        "--no-fork-server", action="store_true", help="every job imports torch on its own"
    )
    ap.add_argument("--seed", type=int, default=0, help="the models' initialisation seed")
    # the warm-up on the training pool's worked solutions
    ap.add_argument("--lr", type=float, default=1e-2, help="warm-up AdamW learning rate")
    ap.add_argument("--batch-size", type=int, default=8, help="warm-up rows per step")
    ap.add_argument("--max-steps", type=int, default=300, help="give up warming after this")
    ap.add_argument("--check-every", type=int, default=10, help="steps between stop checks")
    args = ap.parse_args(argv)
    archs = args.archs.split(",")
    if unknown := sorted(set(archs) - set(MATRIX)):
        ap.error(f"--archs: unknown {unknown}; known: {sorted(MATRIX)}")
    root = Path(args.workdir or tempfile.mkdtemp(prefix="arch_matrix-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with contextlib.ExitStack() as stack:
        args.fork_server = None if args.no_fork_server else stack.enter_context(fork_server(root))
        with ThreadPoolExecutor(args.parallel) as pool:
            rows = list(pool.map(lambda a: run_arch(a, root, args), archs))
    report = {
        "command": " ".join(
            ["python scripts/arch_matrix.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "workdir": str(root),
        "seconds": round(time.time() - t0, 1),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(table(rows))
    print(f"{len(rows)} architectures in {report['seconds']:.0f} s -> {args.out}")
    return 0 if all(r["result"] in ("ran", "refused") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
