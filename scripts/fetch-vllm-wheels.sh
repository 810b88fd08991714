#!/usr/bin/env bash
# vLLM 0.26.0 (the release built for torch 2.11.0, the GPU machine's torch) for the GPU machine,
# as parts that fit its 64 MiB a call: `bash scripts/fetch-vllm-wheels.sh` (from the repository
# root, here, with network) fills the ignored folder .whl-vllm/ with part0..partN (at most 40 MB
# each: the working tree travels in the same call) and SHA256. Carry one part a call
# (`carry: [".whl-vllm/partI", ".whl-vllm/SHA256", ".whl-vllm/PARTS"]`, with `source scripts/device-setup.sh`);
# device-setup.sh installs vLLM into $HOME/gpu-vllm once every part is there.
#
# The vLLM wheel is 290 MB; three of its files are dropped to make it 110 MB, all optional at
# run time on a Hopper GPU with a dense model: FlashAttention 2 (the H100/H200 run FlashAttention
# 3, kept), the fused-MoE kernels (imported under contextlib.suppress), and the `vllm-rs` binary.
# Its other dependencies are those in scripts/vllm-device-wheels.txt (CPython 3.12 wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.whl-vllm
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 \
    manylinux1 manylinux_2_31; do plat+=(--platform "${p}_x86_64"); done
dl() { python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --abi abi3 --abi none "${plat[@]}" --platform any -d "$@"; }
dl "$work/full" vllm==0.26.0
dl "$work/wheels" -r scripts/vllm-device-wheels.txt
python - "$work/full"/vllm-*.whl "$work/wheels" <<'PY'
import sys, zipfile
from pathlib import Path
src = Path(sys.argv[1])
drop = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/_moe_C_stable_libtorch.abi3.so",
        "vllm/vllm-rs")
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(Path(sys.argv[2]) / src.name, "w") as zo:
    for info in zi.infolist():
        other_python = "deep_gemm/_C.cpython-" in info.filename and "cpython-312" not in info.filename
        if info.filename not in drop and not other_python:
            zo.writestr(info, zi.read(info.filename), compress_type=zipfile.ZIP_DEFLATED)
PY
rm -rf "$out" && mkdir -p "$out"
tar -C "$work/wheels" -cf "$work/vllm-wheels.tar" .
split -b 40000000 -d -a 1 "$work/vllm-wheels.tar" "$out/part"
(cd "$work" && sha256sum vllm-wheels.tar) > "$out/SHA256"
ls "$out"/part* | wc -l > "$out/PARTS"
echo "fetch-vllm-wheels: $(cat "$out/PARTS") parts in $out"
