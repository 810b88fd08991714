"""ZeRO-3 training over NCCL on the GPUs of one host, against the same run on one GPU.

    python benchmarks/multi_gpu.py --out multi_gpu.json
        [--gpus 2 --layers 24 --hidden 2048 --steps 12]

With the model and corpus builders of gpu_bench.py, for LoRA and full fine-tuning:
1. one run on 1 GPU (grad_accum = gpus) and one on `gpus` GPUs (grad_accum 1) at the same
   global batch, through `python -m arenaflow.train` / `torchrun -m arenaflow.train`: per-step
   losses compared (bf16: relative tolerance --rtol), tokens/s, and scaling efficiency =
   (tokens/s on N GPUs / N) / tokens/s on 1 GPU;
2. the N-GPU LoRA adapter reloaded with PeftModel.from_pretrained, as a server would, and its
   logits on row 0 compared with the trained engine's (ARENAFLOW_PROBE_LOGITS);
3. LoRA resumed across world sizes: N GPUs killed after step 4's checkpoint -> 1 GPU killed
   after step 8's -> N GPUs to the end, against the uninterrupted N-GPU run.
Exit status 1 if any check fails.
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
    proc = subprocess.run(
        [
            *launcher,
            "arenaflow.train",
            "--arm",
            name,
            "--params-json",
            json.dumps(hp),
            "--corpus",
            str(corpus),
            "--init",
            "base",
            "--base-model",
            str(model),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    r = {
        "name": name,
        "gpus": gpus,
        "rc": proc.returncode,
        "wall_s": time.time() - t,
        "out": str(out),
        "log_tail": proc.stderr[-2500:],
    }
    if proc.returncode == 0:
        m = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
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


@torch.no_grad()
def reload_check(model_dir: Path, adapter: Path, probe: Path) -> float:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda()
    served = PeftModel.from_pretrained(base, adapter).eval()
    p = torch.load(probe)
    got = served(input_ids=p["input_ids"].cuda()).logits.float().cpu()
    return float((got - p["logits"]).norm() / p["logits"].norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", default="/tmp/arenaflow-multi")
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rtol", type=float, default=2e-2, help="per-step loss agreement, bf16")
    ap.add_argument("--methods", default="lora,full")
    args = ap.parse_args()
    n, root = args.gpus, Path(args.root)
    shutil.rmtree(
        root / "runs", ignore_errors=True
    )  # a run left from an earlier call would be read as this one's
    if n < 2:
        raise SystemExit(f"multi_gpu.py needs 2 or more GPUs; this machine has {n}")
    res = {
        "device": f"{n} x {torch.cuda.get_device_name()}",
        "torch": torch.__version__,
        "args": vars(args),
        "checks": {},
    }
    model, shape = gpu_bench.build_model(root, args.layers, args.hidden)
    res["model"] = shape
    corpus = gpu_bench.build_corpus(root, args.steps * args.micro * n + 8, args.seq, mixed=False)
    for method in args.methods.split(","):
        one = train(
            root,
            f"{method}-1gpu",
            model,
            corpus,
            hyper(method, args.micro, n, args.steps, args.seq),
            1,
        )
        env = {"ARENAFLOW_PROBE_LOGITS": str(root / f"{method}-probe.pt")}
        many = train(
            root,
            f"{method}-{n}gpu",
            model,
            corpus,
            hyper(method, args.micro, 1, args.steps, args.seq),
            n,
            env,
        )
        ok = one["rc"] == 0 and many["rc"] == 0
        row = {"one": one, "many": many}
        if ok:
            row["loss_max_rel_diff"] = max_rel(many["losses"], one["losses"])
            row["scaling_efficiency"] = many["tokens_per_s"] / n / one["tokens_per_s"]
            res["checks"][f"{method}: {n}-GPU losses match 1 GPU (rtol {args.rtol})"] = (
                row["loss_max_rel_diff"] <= args.rtol
            )
            res["checks"][f"{method}: evidence world_size {n}"] = (
                many["evidence"]["world_size"] == n
            )
        else:
            res["checks"][f"{method}: both runs finished"] = False
        if ok and method == "lora":
            row["reload_rel_err"] = reload_check(model, Path(many["out"]), root / "lora-probe.pt")
            res["checks"]["lora: reloaded adapter reproduces the engine's logits (bf16, 2e-2)"] = (
                row["reload_rel_err"] < 2e-2
            )
        res[method] = row
    if "lora" in args.methods and res["lora"]["many"]["rc"] == 0:
        hp_n = hyper("lora", args.micro, 1, args.steps, args.seq, checkpoint_every=4)
        hp_1 = hyper("lora", args.micro, n, args.steps, args.seq, checkpoint_every=4)
        legs = [
            train(root, "lora-resume", model, corpus, hp_n, n, {"ARENAFLOW_FAIL_AFTER_STEP": "4"}),
            train(root, "lora-resume", model, corpus, hp_1, 1, {"ARENAFLOW_FAIL_AFTER_STEP": "8"}),
            train(root, "lora-resume", model, corpus, hp_n, n),
        ]
        last = legs[-1]
        res["resume"] = {
            "legs": [{k: v for k, v in leg.items() if k != "evidence"} for leg in legs]
        }
        resumed = [
            ("resumed from" in leg["log_tail"] and "another world size" in leg["log_tail"])
            for leg in legs[1:]
        ]
        res["checks"]["resume: N->1->N legs resumed through the universal checkpoint"] = all(
            resumed
        )
        if last["rc"] == 0:
            res["resume"]["loss_max_rel_diff"] = max_rel(
                last["losses"], res["lora"]["many"]["losses"]
            )
            res["checks"]["resume: losses match the uninterrupted N-GPU run"] = (
                res["resume"]["loss_max_rel_diff"] <= args.rtol
            )
            res["checks"]["resume: evidence resumed_from_step 8"] = (
                last["evidence"]["resumed_from_step"] == 8
            )
        else:
            res["checks"]["resume: final leg finished"] = False
    Path(args.out).write_text(json.dumps(res, indent=2, default=str))
    for method in args.methods.split(","):
        row = res.get(method, {})
        if "scaling_efficiency" in row:
            print(
                f"{method}: 1 GPU {row['one']['tokens_per_s']:.0f} tok/s, "
                f"{n} GPUs {row['many']['tokens_per_s']:.0f} tok/s, "
                f"scaling efficiency {row['scaling_efficiency']:.1%}, "
                f"loss max rel diff {row['loss_max_rel_diff']:.2e}"
            )
    for check, passed in res["checks"].items():
        print(("PASS " if passed else "FAIL ") + check)
    sys.exit(0 if res["checks"] and all(res["checks"].values()) else 1)


if __name__ == "__main__":
    main()
