"""ZeRO training on the GPUs of one host, against the same run on one GPU (issues 23, 24).

    python benchmarks/multi_gpu.py --out multi_gpu.json
        [--gpus 8 --resume-via 4 --layers 24 --hidden 2048 --micro 16 --steps 12]
    python benchmarks/multi_gpu.py --device cpu --gpus 4 ...   # the same checks on gloo ranks

With the model and corpus builders of gpu_bench.py, for LoRA and full fine-tuning:
1. one run on 1 GPU (grad_accum = gpus) and one on `gpus` GPUs (grad_accum 1) at the same
   global batch, through `python -m arenaflow.train` / `torchrun -m arenaflow.train`: per-step
   losses compared (bf16: relative tolerance --rtol), tokens/s, and scaling efficiency =
   (tokens/s on N GPUs / N) / tokens/s on 1 GPU (the target: 85 % for full fine-tuning
   at 8, printed as a target line);
2. the N-GPU LoRA adapter reloaded with PeftModel.from_pretrained, as a server would, and its
   logits on row 0 compared with the trained engine's (ARENAFLOW_PROBE_LOGITS);
3. LoRA resumed across world sizes: N GPUs killed after step 4's checkpoint -> M (--resume-via,
   default N/2) killed after step 8's -> N to the end, against the uninterrupted N-GPU run: its
   per-step losses and its final adapter's weights (relative Frobenius difference per tensor).
Exit status 1 if any check fails. On CPU (`--device cpu`, fp32 weights as arenaflow loads them
there) the checks are the same and the rates mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import gpu_bench  # noqa: E402  (a sibling script, not a package)

TARGET_EFFICIENCY = 0.85  # full fine-tuning at 8 GPUs


def hyper(method: str, micro: int, accum: int, steps: int, seq: int, **extra) -> dict:
    # learning rates that move a random model's loss visibly in 10 steps, so agreement means
    # something
    return gpu_bench.hyperparameters(
        method, micro, accum, steps, seq, 2e-4 if method == "lora" else 2e-5, **extra
    )


def train(
    root: Path, name: str, model: Path, corpus: Path, hp: dict, gpus: int, env: dict | None = None
) -> dict:
    out = root / "runs" / name / "final"
    launcher = (
        [sys.executable, "-m"]
        if gpus == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={gpus}",
            "-m",
        ]
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus))), **(env or {})}
    t = time.time()
    argv = gpu_bench.train_argv(name, hp, corpus, model, out, launcher)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    r = {
        "name": name,
        "gpus": gpus,
        "rc": proc.returncode,
        "wall_s": time.time() - t,
        "out": str(out),
        "log_tail": proc.stderr[-2500:],
        # the resume line, wherever it is in the log (ranks' warnings can push it out of the tail)
        "resumed": next((x for x in proc.stderr.splitlines() if "resumed from" in x), None),
    }
    if proc.returncode == 0:
        m = gpu_bench.run_metrics(out)
        r.update(
            losses=[x["loss"] for x in m],
            tokens_per_s=gpu_bench.timed_rate(m)[0],
            evidence=json.loads((out / "training_evidence.json").read_text()),
        )
    print(
        name,
        {k: v for k, v in r.items() if k not in ("log_tail", "losses", "evidence")},
        flush=True,
    )
    return r


def max_rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def weights_rel_diff(got: Path, want: Path) -> float:
    """The largest relative Frobenius difference, tensor by tensor, between the safetensors
    weights of two saved runs (a PEFT adapter or a full model); inf if their tensors differ."""
    from safetensors.torch import load_file

    def load(d: Path) -> dict:
        return {k: v for f in sorted(d.glob("*.safetensors")) for k, v in load_file(f).items()}

    a, b = load(got), load(want)
    if not b or a.keys() != b.keys():
        return float("inf")
    return max(float((a[k].float() - b[k].float()).norm() / b[k].float().norm()) for k in b)


@torch.no_grad()
def reload_check(model_dir: Path, adapter: Path, probe: Path, device: str) -> float:
    from peft import PeftModel

    from arenaflow import models

    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # as arenaflow.models loads it
    base = models.from_pretrained(model_dir, dtype=dtype).to(device)
    served = PeftModel.from_pretrained(base, adapter).eval()
    p = torch.load(probe)
    got = served(input_ids=p["input_ids"].to(device)).logits.float().cpu()
    return float((got - p["logits"]).norm() / p["logits"].norm())


def compare_method(args, res: dict, method: str, model: Path, corpus: Path) -> None:
    """One run on 1 device (grad_accum n) and one on n (grad_accum 1): losses, world size,
    scaling efficiency and, for LoRA, the reloaded adapter."""
    n, root = args.gpus, Path(args.root)
    one = train(
        root, f"{method}-1gpu", model, corpus, hyper(method, args.micro, n, args.steps, args.seq), 1
    )
    env = {"ARENAFLOW_PROBE_LOGITS": str(root / f"{method}-probe.pt")}
    hp = hyper(method, args.micro, 1, args.steps, args.seq)
    many = train(root, f"{method}-{n}gpu", model, corpus, hp, n, env)
    row = res[method] = {"one": one, "many": many}
    if one["rc"] != 0 or many["rc"] != 0:
        res["checks"][f"{method}: both runs finished"] = False
        return
    row["loss_max_rel_diff"] = max_rel(many["losses"], one["losses"])
    row["scaling_efficiency"] = many["tokens_per_s"] / n / one["tokens_per_s"]
    res["checks"][f"{method}: {n}-GPU losses match 1 GPU (rtol {args.rtol})"] = (
        row["loss_max_rel_diff"] <= args.rtol
    )
    res["checks"][f"{method}: evidence world_size {n}"] = many["evidence"]["world_size"] == n
    if method == "lora":
        probe = root / "lora-probe.pt"
        row["reload_rel_err"] = reload_check(model, Path(many["out"]), probe, args.device)
        res["checks"]["lora: reloaded adapter reproduces the engine's logits (2e-2)"] = (
            row["reload_rel_err"] < 2e-2
        )


def resume_check(args, res: dict, model: Path, corpus: Path) -> None:
    """LoRA on n devices killed after step 4's checkpoint -> m devices killed after step 8's ->
    n devices to the end, each leg at the same global batch, against the uninterrupted n-device
    run: its losses and its final adapter's weights."""
    n, m, root = args.gpus, args.resume_via, Path(args.root)
    hp_n = hyper("lora", args.micro, 1, args.steps, args.seq, checkpoint_every=4)
    hp_m = hyper("lora", args.micro, n // m, args.steps, args.seq, checkpoint_every=4)
    legs = [
        train(root, "lora-resume", model, corpus, hp_n, n, {"ARENAFLOW_FAIL_AFTER_STEP": "4"}),
        train(root, "lora-resume", model, corpus, hp_m, m, {"ARENAFLOW_FAIL_AFTER_STEP": "8"}),
        train(root, "lora-resume", model, corpus, hp_n, n),
    ]
    last, whole = legs[-1], res["lora"]["many"]
    res["resume"] = {"legs": [{k: v for k, v in leg.items() if k != "evidence"} for leg in legs]}
    resumed = [leg["resumed"] and "another world size" in leg["resumed"] for leg in legs[1:]]
    checks = res["checks"]
    checks[f"resume: {n}->{m}->{n} legs resumed through the universal checkpoint"] = all(resumed)
    if last["rc"] != 0:
        checks["resume: final leg finished"] = False
        return
    res["resume"]["loss_max_rel_diff"] = max_rel(last["losses"], whole["losses"])
    res["resume"]["weights_rel_diff"] = weights_rel_diff(Path(last["out"]), Path(whole["out"]))
    checks["resume: losses match the uninterrupted N-GPU run"] = (
        res["resume"]["loss_max_rel_diff"] <= args.rtol
    )
    checks[f"resume: final adapter weights match the uninterrupted run (rtol {args.rtol})"] = (
        res["resume"]["weights_rel_diff"] <= args.rtol
    )
    checks["resume: evidence resumed_from_step 8"] = last["evidence"]["resumed_from_step"] == 8


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", default="/tmp/arenaflow-multi")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--gpus", type=int, help="ranks (default: every CUDA device)")
    ap.add_argument("--resume-via", type=int, help="the middle leg's ranks (default gpus // 2)")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rtol", type=float, default=2e-2, help="per-step loss agreement, bf16")
    ap.add_argument("--methods", default="lora,full")
    args = ap.parse_args()
    if args.gpus is None:
        args.gpus = torch.cuda.device_count() if args.device == "cuda" else 2
    if args.gpus < 2:
        raise SystemExit(f"multi_gpu.py needs 2 or more ranks; --gpus is {args.gpus}")
    args.resume_via = args.resume_via or max(1, args.gpus // 2)
    if args.gpus % args.resume_via or args.resume_via >= args.gpus:
        raise SystemExit(
            f"--resume-via {args.resume_via}: must divide --gpus {args.gpus} and be smaller "
            "(the middle leg keeps the global batch with grad_accum gpus / resume-via)"
        )
    return args


def report(args, res: dict) -> None:
    n = args.gpus
    for method in args.methods.split(","):
        row = res.get(method, {})
        if "scaling_efficiency" in row:
            print(
                f"{method}: 1 GPU {row['one']['tokens_per_s']:.0f} tok/s, "
                f"{n} GPUs {row['many']['tokens_per_s']:.0f} tok/s, "
                f"scaling efficiency {row['scaling_efficiency']:.1%}, "
                f"loss max rel diff {row['loss_max_rel_diff']:.2e}"
            )
    if "weights_rel_diff" in res.get("resume", {}):
        print(
            f"resume {n}->{args.resume_via}->{n}: weights rel diff "
            f"{res['resume']['weights_rel_diff']:.2e}"
        )
    full = res.get("full", {}).get("scaling_efficiency")
    if args.device == "cuda" and full is not None:  # the target, at 8 GPUs
        print(
            f"target full fine-tuning scaling efficiency >= {TARGET_EFFICIENCY:.0%} at {n} "
            f"GPUs: {full:.1%} -> {'MET' if full >= TARGET_EFFICIENCY else 'NOT MET'}"
        )
    for check, passed in res["checks"].items():
        print(("PASS " if passed else "FAIL ") + check)


def main() -> None:
    args = parse_args()
    n, root = args.gpus, Path(args.root)
    # a run left from an earlier call would be read as this one's
    shutil.rmtree(root / "runs", ignore_errors=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (gloo)"
    res = {
        "device": f"{n} x {device}",
        "torch": torch.__version__,
        "args": vars(args),
        "checks": {},
    }
    model, res["model"] = gpu_bench.build_model(root, args.layers, args.hidden, args.device)
    corpus = gpu_bench.build_corpus(root, args.steps * args.micro * n + 8, args.seq, mixed=False)
    for method in args.methods.split(","):
        compare_method(args, res, method, model, corpus)
    if res.get("lora", {}).get("many", {}).get("rc") == 0:
        resume_check(args, res, model, corpus)
    Path(args.out).write_text(json.dumps(res, indent=2, default=str))
    report(args, res)
    sys.exit(0 if res["checks"] and all(res["checks"].values()) else 1)


if __name__ == "__main__":
    main()
