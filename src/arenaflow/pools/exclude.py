"""A pool's `exclude: [pool ids]`: no row of it has a prompt equal, after norm_prompt, to one of
those built pools' (pools/{id}.jsonl), so that consecutive rounds draw fresh prompts. A generated
pool draws on along its seeded sequence until it has n rows that are not excluded; an import drops
excluded rows before its sample of n; a pool that excludes nothing is built exactly as before.
Also the config's check of the `exclude` lists (check_exclude).
"""

from __future__ import annotations

import graphlib

# the module, not its names: arenaflow.config imports this module (check_exclude)
from arenaflow import io


def norm_prompt(text: str) -> str:
    """A prompt as exclusion compares it: whitespace runs collapsed to one space and the ends
    stripped (a re-wrapped or re-indented copy is the same prompt); case and punctuation are
    kept, since they can change what is asked."""
    return " ".join(text.split())


class Excluded:
    """The normalised prompts a pool may not reuse, and how many candidates they turned away
    (for the build's log line)."""

    def __init__(self, prompts=()):
        self.prompts = {norm_prompt(p) for p in prompts}
        self.skipped = 0

    @classmethod
    def from_files(cls, paths) -> Excluded:
        """The prompts of the pools files `paths` (pools/{id}.jsonl)."""
        return cls(row["prompt"] for path in paths for row in io.read_jsonl(path))

    def __len__(self) -> int:
        return len(self.prompts)

    def hits(self, prompt: str) -> bool:
        return norm_prompt(prompt) in self.prompts

    def drops(self, prompt: str) -> bool:
        """hits(), counting the candidate as skipped."""
        hit = self.hits(prompt)
        self.skipped += hit
        return hit


def check_exclude(pools: dict) -> list[tuple[str, str]]:
    """Problems with the pools' `exclude` lists, as (key, message), the key from the config's
    root (pools/<id>/exclude): an unknown pool, a pool excluding itself (it would need its own
    file first), a cycle (each pool would wait for the other's file)."""
    problems = []
    for pid, pool in pools.items():
        for other in pool.get("exclude", []):
            if other == pid:
                problems.append((f"pools/{pid}/exclude", f"pool {pid!r} cannot exclude itself"))
            elif other not in pools:
                problems.append(
                    (f"pools/{pid}/exclude", f"unknown pool {other!r}; known: {sorted(pools)}")
                )
    graph = {
        pid: [o for o in p.get("exclude", []) if o in pools and o != pid]
        for pid, p in pools.items()
    }
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        cycle = e.args[1][::-1]  # [a, ..., a], a pool before the one it excludes
        problems.append(
            (
                f"pools/{cycle[0]}/exclude",
                f"pools exclude each other in a cycle: {' excludes '.join(cycle)}",
            )
        )
    return problems
