"""The package's imports go one way: no module imports another that (through any chain) imports
it back, and no stage module imports arenaflow.config (they read defaults from arenaflow.schema;
config calls their validators). Imports inside functions count: they are edges all the same."""

import ast
import graphlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
# Entry points that read config files named on their command line, as Snakemake does.
CONFIG_READERS = {"arenaflow.budget.plan", "arenaflow.rounds.reregister"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((SRC / "arenaflow").rglob("*.py"))}


def imported(name: str, path: Path) -> set[str]:
    """The arenaflow modules `name` imports (a package's name where no submodule is named)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            named = {f"{base}.{a.name}" for a in node.names}
            out |= {m if m in MODULES else base for m in named}
    return {m for m in out if m in MODULES and m != name}


def graph() -> dict[str, set[str]]:
    g = {name: imported(name, path) for name, path in MODULES.items()}
    # a package's __init__ runs before any of its modules: importing one imports the package
    # (but a package's own modules may import each other under its __init__)
    for name, deps in g.items():
        mine = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        for d in list(deps):
            parts = d.split(".")
            deps |= {".".join(parts[:i]) for i in range(2, len(parts))} & set(MODULES) - mine
    return g


def test_no_import_cycle():
    try:
        list(graphlib.TopologicalSorter(graph()).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_no_stage_module_imports_config():
    offenders = sorted(
        f"{name} imports arenaflow.config"
        for name, deps in graph().items()
        if not name.startswith("arenaflow.config")
        and name not in CONFIG_READERS
        and any(d == "arenaflow.config" or d.startswith("arenaflow.config.") for d in deps)
    )
    assert not offenders, offenders


def test_the_walk_sees_known_edges():
    """The walker itself: it finds an edge every reader can see in the source."""
    g = graph()
    assert "arenaflow.schema" in g["arenaflow.config.resolve"]
    assert "arenaflow.config" in g["arenaflow.budget.plan"]
    assert "arenaflow.decode.static" in g["arenaflow.decode.sampling"]


# Stages below the rounds and the bundles never import them; this one edge predates the rule
# (a comparison reads the bar's clause grammar) and is the only one allowed.
STAGES = (
    *("decode", "train", "evals", "corpora", "pools"),
    *("candidates", "merge", "servers", "verify"),
)
KNOWN_UPWARD = {
    ("arenaflow.evals.compare", "arenaflow.rounds.bar"),
    ("arenaflow.evals.compare", "arenaflow.rounds"),  # its package, imported with it
}


def test_no_stage_module_imports_rounds_or_bundles():
    upward = sorted(
        (name, d)
        for name, deps in graph().items()
        if name.split(".")[1:2] and name.split(".")[1] in STAGES
        for d in deps
        if d.split(".")[1:2] in (["rounds"], ["bundles"])
    )
    assert set(upward) <= KNOWN_UPWARD, sorted(set(upward) - KNOWN_UPWARD)
