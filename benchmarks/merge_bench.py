"""Weight-space merges: arenaflow.merge.build's streamed merge against loading
everything.

    python benchmarks/merge_bench.py [--dir /tmp/merge_bench] [--out-root DIR] [--repeats 3]
                                     [--no-peft] [--out merge.json]

Builds synthetic parents of a Llama-3.2-1B-like shape (16 layers, hidden 2048, MLP 8192, 8 KV
heads of 64, vocab 128,256, tied embeddings; 1.24 B parameters) once under --dir:
  - the base, bf16 (2.47 GB; only its headers are read by the soups below),
  - two LoRA adapters r=64 / alpha 128 on all seven projections with lm_head in
    modules_to_save: factors float32 (PEFT keeps adapter weights in float32) and the head bf16
    (modules_to_save copies the bf16 base's head), 705 MB each, saved with safetensors' save_file
    and an arenaflow manifest, as a training run leaves them,
  - the same two adapters without the head (180 MB each), the only soup PEFT's own
    add_weighted_adapter accepts (it refuses two adapters with the same modules_to_save).
Then, each in a fresh subprocess (peak RSS = the child's VmHWM), best of --repeats by wall time,
the methods taking turns:
  - streamed: arenaflow.merge.build.merge, the 0.5/0.5 soup, timed whole (sha256 of both parents,
    the merge, the output's manifest) and by phase (from its evidence);
  - load-all: safetensors.torch.load_file of both adapters, the same concatenation and float32
    sum on whole tensors, one save_file (no manifest checks);
  - PEFT (head-less adapters): load the base, both adapters, add_weighted_adapter(cat),
    save_pretrained of the soup.
Every parent file is read once before each run (page cache warm), then `sync` (no dirty pages
left by the previous run). GB/s = bytes of tensors read from the parents (and base, when read) /
wall time. Ratios are streamed / other, in this one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHAPE = {"layers": 16, "hidden": 2048, "mlp": 8192, "kv": 512, "vocab": 128256}
PROJ = {
    "self_attn.q_proj": ("hidden", "hidden"),
    "self_attn.k_proj": ("kv", "hidden"),
    "self_attn.v_proj": ("kv", "hidden"),
    "self_attn.o_proj": ("hidden", "hidden"),
    "mlp.gate_proj": ("mlp", "hidden"),
    "mlp.up_proj": ("mlp", "hidden"),
    "mlp.down_proj": ("hidden", "mlp"),
}
R, ALPHA = 64, 128


def base_shapes() -> dict[str, tuple[int, ...]]:
    h = SHAPE["hidden"]
    out = {"model.embed_tokens.weight": (SHAPE["vocab"], h), "model.norm.weight": (h,)}
    for i in range(SHAPE["layers"]):
        for name, (o, n) in PROJ.items():
            out[f"model.layers.{i}.{name}.weight"] = (SHAPE[o], SHAPE[n])
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"model.layers.{i}.{norm}.weight"] = (h,)
    return out


def build_base(d: Path) -> None:
    """bf16 random weights, streamed to disk by arenaflow.merge.stream's writer (2.47 GB)."""
    from transformers import LlamaConfig

    from arenaflow.merge import stream

    LlamaConfig(
        vocab_size=SHAPE["vocab"],
        hidden_size=SHAPE["hidden"],
        intermediate_size=SHAPE["mlp"],
        num_hidden_layers=SHAPE["layers"],
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        tie_word_embeddings=True,
        dtype="bfloat16",
    ).save_pretrained(str(d))

    def rand(shape):
        return lambda: iter([torch.empty(shape, dtype=torch.bfloat16).normal_(0, 0.02)])

    entries = [stream.Entry(k, torch.bfloat16, s, rand(s)) for k, s in base_shapes().items()]
    stream.write_safetensors(d / "model.safetensors", entries)


def build_adapter(d: Path, seed: int, head: bool) -> None:
    from peft import LoraConfig
    from safetensors.torch import save_file

    from arenaflow import manifest

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(SHAPE["layers"]):
        for name, (o, n) in PROJ.items():
            key = f"base_model.model.model.layers.{i}.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(R, SHAPE[n], generator=g) * 0.01
            tensors[f"{key}.lora_B.weight"] = torch.randn(SHAPE[o], R, generator=g) * 0.01
    if head:
        tensors["base_model.model.lm_head.weight"] = (
            torch.randn(SHAPE["vocab"], SHAPE["hidden"], generator=g) * 0.02
        ).to(torch.bfloat16)
    d.mkdir(parents=True)
    save_file(tensors, str(d / "adapter_model.safetensors"), metadata={"format": "pt"})
    LoraConfig(
        r=R,
        lora_alpha=ALPHA,
        target_modules=[p.split(".")[1] for p in PROJ],
        modules_to_save=["lm_head"] if head else None,
        task_type="CAUSAL_LM",
    ).save_pretrained(str(d))
    manifest.write(d, extra={"arm": d.name})


def build(root: Path) -> dict[str, Path]:
    dirs = {
        "base": root / "base",
        "H1": root / "H1",
        "H2": root / "H2",
        "L1": root / "L1",
        "L2": root / "L2",
    }
    if not (dirs["base"] / "model.safetensors").exists():
        dirs["base"].mkdir(parents=True, exist_ok=True)
        build_base(dirs["base"])
    for i, name in enumerate(["H1", "H2", "L1", "L2"]):
        if not (dirs[name] / "manifest.json").exists():
            build_adapter(dirs[name], seed=i % 2, head=name.startswith("H"))
    return dirs


# ---------------------------------------------------------------- children


def hwm() -> dict:
    status = dict(
        line.split(":", 1)
        for line in Path("/proc/self/status").read_text().splitlines()
        if ":" in line
    )
    return {k: int(status[k].split()[0]) * 1024 for k in ("VmHWM", "VmRSS")}


def child_streamed(root: Path, pair: list[str], out: Path) -> dict:
    from arenaflow.merge import build as merge

    start = hwm()["VmRSS"]
    t = time.perf_counter()
    ev = merge.merge([(a, str(root / a), 0.5) for a in pair], str(root / "base"), str(out), "soup")
    wall = time.perf_counter() - t
    return {
        "wall_s": wall,
        "phases_s": {**ev["phases_s"], "manifest_write": wall - ev["wall_time_s"]},
        "bytes_read": ev["bytes_read"],
        "bytes_written": ev["bytes_written"],
        "rss_after_imports": start,
        **hwm(),
    }


def child_loadall(root: Path, pair: list[str], out: Path) -> dict:
    """The same merge with every tensor in memory: both files loaded whole, whole-tensor math."""
    from safetensors.torch import load_file, save_file

    start = hwm()["VmRSS"]
    t = time.perf_counter()
    ts = [load_file(str(root / a / "adapter_model.safetensors")) for a in pair]
    nread = sum(x.numel() * x.element_size() for d in ts for x in d.values())
    merged, s = {}, ALPHA / R
    for key in ts[0]:
        if key.endswith("lora_A.weight"):
            merged[key] = torch.cat([d[key] for d in ts])
        elif key.endswith("lora_B.weight"):
            merged[key] = torch.cat([0.5 * s * d[key].float() for d in ts], dim=1).to(
                ts[0][key].dtype
            )
        else:
            merged[key] = (ts[0][key].float() * 0.5 + ts[1][key].float() * 0.5).to(ts[0][key].dtype)
    out.mkdir(parents=True, exist_ok=True)
    save_file(merged, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    wall = time.perf_counter() - t
    return {"wall_s": wall, "bytes_read": nread, "rss_after_imports": start, **hwm()}


def child_peft(root: Path, pair: list[str], out: Path) -> dict:
    from peft import PeftModel

    from arenaflow import models

    start = hwm()["VmRSS"]
    t = time.perf_counter()
    model = models.from_pretrained(root / "base", dtype=torch.bfloat16)
    model = PeftModel.from_pretrained(model, str(root / pair[0]), adapter_name=pair[0])
    model.load_adapter(str(root / pair[1]), adapter_name=pair[1])
    t_load = time.perf_counter() - t
    model.add_weighted_adapter(pair, [0.5, 0.5], "soup", combination_type="cat")
    model.save_pretrained(str(out), selected_adapters=["soup"])
    wall = time.perf_counter() - t
    nread = sum((root / a / "adapter_model.safetensors").stat().st_size for a in pair)
    return {
        "wall_s": wall,
        "phases_s": {
            "load_base_and_adapters": t_load,
            "add_weighted_adapter_and_save": wall - t_load,
        },
        "bytes_read": nread,
        "base_bytes_loaded": (root / "base" / "model.safetensors").stat().st_size,
        "rss_after_imports": start,
        **hwm(),
    }


CHILDREN = {"streamed": child_streamed, "loadall": child_loadall, "peft": child_peft}


# ---------------------------------------------------------------- parent


def warm(paths: list[Path]) -> None:
    for d in paths:
        for f in sorted(d.rglob("*")):
            if f.is_file():
                with open(f, "rb") as fh:
                    while fh.read(16 << 20):
                        pass


def run_child(mode: str, root: Path, pair: list[str], out: Path) -> dict:
    subprocess.run(["rm", "-rf", str(out)], check=True)
    warm([root / a for a in pair] + ([root / "base"] if mode == "peft" else []))
    os.sync()  # no run pays for the writeback of the one before it
    cmd = [
        sys.executable,
        __file__,
        "--child",
        mode,
        "--dir",
        str(root),
        "--pair",
        *pair,
        "--child-out",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def best_of(modes: list[str], root: Path, out_root: Path, pair: list[str], repeats: int) -> dict:
    """Best run of each mode by wall time; the modes take turns, so that a disturbance on this
    shared machine (another job's I/O) falls on all of them alike."""
    runs = {m: [] for m in modes}
    for _ in range(repeats):
        for m in modes:
            runs[m].append(run_child(m, root, pair, out_root / f"out-{m}-{'-'.join(pair)}"))
    return {
        m: {**min(rs, key=lambda r: r["wall_s"]), "all_wall_s": [round(r["wall_s"], 3) for r in rs]}
        for m, rs in runs.items()
    }


def same_output(a: Path, b: Path) -> bool:
    from safetensors import safe_open

    with safe_open(str(a), "pt") as fa, safe_open(str(b), "pt") as fb:
        return set(fa.keys()) == set(fb.keys()) and all(
            torch.equal(fa.get_tensor(k), fb.get_tensor(k)) for k in fa.keys()
        )


def machine() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in open("/proc/cpuinfo")
            if line.startswith("model name")
        ),
        "?",
    )
    mem = next(
        line.split(":", 1)[1].strip()
        for line in open("/proc/meminfo")
        if line.startswith("MemTotal")
    )
    import peft
    import safetensors

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem": mem,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "peft": peft.__version__,
        "torch_threads": torch.get_num_threads(),
        "commit": commit,
        "load_before": os.getloadavg(),
    }


def dd_write(root: Path) -> dict:
    """Reference write speeds: 1 GiB into the page cache (three times: the first often waits for
    the kernel to free cached pages), and flushed to the disk (fdatasync)."""
    out = {}
    for name, extra in (
        ("page_cache_1", []),
        ("page_cache_2", []),
        ("page_cache_3", []),
        ("fdatasync", ["conv=fdatasync"]),
    ):
        os.sync()
        res = subprocess.run(
            ["dd", "if=/dev/zero", f"of={root / 'dd.tmp'}", "bs=16M", "count=64", *extra],
            capture_output=True,
            text=True,
            check=True,
        )
        out[name] = res.stderr.strip().splitlines()[-1].rsplit(",", 1)[-1].strip()
        (root / "dd.tmp").unlink()
    return out


def report(res: dict) -> None:
    gb = lambda r: r["bytes_read"] / r["wall_s"] / 1e9  # noqa: E731
    for label, key in (
        ("soup of two adapters with lm_head", "heads"),
        ("soup of two head-less adapters", "factors"),
    ):
        rows = res[key]
        s = rows["streamed"]
        merge_s = s["phases_s"]["merge"]
        print(f"\n{label}: {s['bytes_read'] / 1e9:.3f} GB of tensors read")
        print(
            f"  streamed, whole call    {s['wall_s']:6.2f} s  {gb(s):5.2f} GB/s  "
            f"peak RSS {s['VmHWM'] / 2**20:6.0f} MiB"
            f"  (after imports {s['rss_after_imports'] / 2**20:.0f} MiB)"
        )
        print(
            f"    phases: verify parents {s['phases_s']['verify_parents']:.2f} s, "
            f"merge {merge_s:.2f} s ({s['bytes_read'] / merge_s / 1e9:.2f} GB/s), "
            f"output manifest {s['phases_s']['manifest_write']:.2f} s"
        )
        for mode in ("loadall", "peft"):
            if mode in rows:
                r = rows[mode]
                print(
                    f"  {mode:8s}                {r['wall_s']:6.2f} s  {gb(r):5.2f} GB/s  "
                    f"peak RSS {r['VmHWM'] / 2**20:6.0f} MiB"
                    f"  (after imports {r['rss_after_imports'] / 2**20:.0f} MiB)"
                )
                print(
                    f"    streamed / {mode}: wall x{s['wall_s'] / r['wall_s']:.2f} "
                    f"(merge phase only x{merge_s / r['wall_s']:.2f}),"
                    f" peak RSS x{s['VmHWM'] / r['VmHWM']:.2f}"
                )
    print(f"\noutputs identical, streamed vs load-all: {res['identical']}")
    print(f"dd into {res['out_root']}: {res['dd']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dir", default="/tmp/merge_bench", help="parents are built here once and reused"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--no-peft",
        action="store_true",
        help="skip PEFT's add_weighted_adapter (loads the 2.5 GB base)",
    )
    ap.add_argument(
        "--out-root",
        default=None,
        help="where the merged outputs go (default: --dir); "
        "/dev/shm takes the disk's write speed out of the numbers",
    )
    ap.add_argument("--out", default=None, help="optional JSON results")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--pair", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    root = Path(args.dir)
    if args.child:
        print(json.dumps(CHILDREN[args.child](root, args.pair, Path(args.child_out))))
        return
    t = time.perf_counter()
    build(root)
    out_root = Path(args.out_root or root)
    out_root.mkdir(parents=True, exist_ok=True)
    res = {
        "machine": machine(),
        "shape": SHAPE,
        "lora": {"r": R, "alpha": ALPHA},
        "build_s": time.perf_counter() - t,
        "out_root": str(out_root),
        "repeats": args.repeats,
    }
    res["heads"] = best_of(["streamed", "loadall"], root, out_root, ["H1", "H2"], args.repeats)
    res["factors"] = best_of(
        ["streamed", "loadall", *(() if args.no_peft else ["peft"])],
        root,
        out_root,
        ["L1", "L2"],
        args.repeats,
    )
    res["identical"] = same_output(
        out_root / "out-streamed-H1-H2/adapter_model.safetensors",
        out_root / "out-loadall-H1-H2/adapter_model.safetensors",
    )
    res["dd"] = dd_write(out_root)
    res["machine"]["load_after"] = os.getloadavg()
    report(res)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
