"""The GPU-minute budget: what was spent, what pending arms would spend, and the refusal.
Over 400 lines: Budget is one estimator over a config and its results, its methods sharing caches.

Budget applies arenaflow.budget.cost's model to a resolved config (`budget:`) and its results;
BudgetError refuses, while the DAG is built (rules/common.smk), a run that would overrun it, as
lineage 003 overran its Slurm GrpTRESMins cap (docs/lineages.md#003-the-gpu-minute-budget).
`python -m arenaflow.budget.plan` picks which arms fit.
"""

from __future__ import annotations

import glob as globmod
import json
import statistics
from pathlib import Path

from arenaflow import paths
from arenaflow.budget.cost import (
    ArmEstimate,
    generate_minutes,
    gpus,
    job_minutes,
    measured_row_seconds,
    record_minutes,
    train_minutes,
    train_steps,
)
from arenaflow.evals import mcguard
from arenaflow.schema import (
    REPO_ROOT,
    TRAINED,
    decoding_of,
    regime,
    schema_defaults,
    search_regimes,
)


class BudgetError(RuntimeError):
    pass


def settings(cfg: dict) -> dict | None:
    """The resolved config's budget section (its defaults filled by arenaflow.config.resolve),
    or None when there is none."""
    b = cfg.get("budget")
    if b is None:
        return None
    return {
        "gpu_minutes": float(b["gpu_minutes"]),
        "spent_gpu_minutes": float(b["spent_gpu_minutes"]),
        "history": list(b["history"]),
        "estimate": dict(b["estimate"]),
    }


def unbudgeted() -> dict:
    """The settings of a config with no budget: no limit, the schema's defaults otherwise."""
    return settings(
        {
            "budget": {
                **schema_defaults("budget"),
                "gpu_minutes": float("inf"),
                "estimate": schema_defaults("estimate"),
            }
        }
    )


def count_rows(path: Path) -> int:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with open(path) as f:
        return sum(1 for line in f if line.strip())


class Budget:
    """Estimates and spending for one resolved config (arenaflow.config.resolve) and its results."""

    def __init__(
        self,
        cfg: dict,
        results: Path | str | None = None,
        repo_root: Path = REPO_ROOT,
        gpu_minutes: float | None = None,
    ):
        self.cfg = cfg
        self.repo = Path(repo_root)
        self.results = Path(results) if results is not None else self.repo / cfg["results_dir"]
        s = settings(cfg) or unbudgeted()
        if gpu_minutes is not None:
            s["gpu_minutes"] = float(gpu_minutes)
        self.settings = s
        self.est = s["estimate"]
        self._records: list[tuple[str, dict]] | None = None
        self._estimates: dict[str, ArmEstimate] = {}

    def refresh(self) -> None:
        """Forget what was read from disk (history, estimates): jobs may have run since."""
        self._records, self._estimates = None, {}

    # ---- what exists -------------------------------------------------------------------
    def history(self) -> list[tuple[str, dict]]:
        """(path, record) of every training_evidence.json the history globs match, deduplicated
        by (arm, job id, dataset): a bundle's copy of a run's evidence is not a second run."""
        if self._records is None:
            seen, out = set(), []
            for pattern in self.settings["history"]:
                p = pattern if Path(pattern).is_absolute() else str(self.results / pattern)
                for path in sorted(globmod.glob(p)):
                    try:
                        rec = json.loads(Path(path).read_text())
                    except (OSError, json.JSONDecodeError):
                        continue
                    key = (rec.get("arm"), rec.get("job_id"), rec.get("dataset_sha256"))
                    if key not in seen:
                        seen.add(key)
                        out.append((path, rec))
            self._records = out
        return self._records

    def row_seconds(self) -> tuple[float, str]:
        """Seconds per 1024-token row per rank, and where the number comes from."""
        base = self.cfg["base"]["name"]
        recs = [r for _, r in self.history()]
        for subset, what in (
            ([r for r in recs if r.get("base_model") == base], f"runs of {base}"),
            (recs, "runs"),
        ):
            vals = [v for v in map(measured_row_seconds, subset) if v]
            if vals:
                return statistics.median(vals), f"median of {len(vals)} measured {what}"
        return float(self.est["row_seconds"]), "prior (estimate.row_seconds)"

    def pending(self, arm: str) -> bool:
        return not (self.results / paths.run(arm)).exists()

    def pool_rows(self, pool: str) -> int:
        built = self.results / paths.pool(pool)
        if built.exists():
            return count_rows(built)
        p = self.cfg["pools"][pool]
        if "n" in p:
            return int(p["n"])
        f = Path(p["file"])
        return count_rows(f if f.is_absolute() else self.repo / f)

    def mix_rows(self, mix: dict) -> int:
        """Rows a mixture trains on: each source's count (no more than a built corpus has), or
        all its rows."""
        return sum(
            self.corpus_rows(c) if n == "all" else min(n, self.corpus_rows(c))
            for c, n in mix.items()
        )

    def corpus_rows(self, corpus: str) -> int:
        stats = self.results / "corpora" / corpus / "stats.json"
        if stats.exists():
            return int(json.loads(stats.read_text())["rows"])
        return self.pool_rows(self.cfg["corpora"][corpus]["pool"])

    # ---- per GPU job -------------------------------------------------------------------
    def train(self, arm: str) -> tuple[int, int, float]:
        """(rows, steps, GPU-minutes) of training `arm`."""
        hyper = self.cfg["arms"][arm]["hyper"]
        rows = self.mix_rows(self.cfg["arms"][arm]["mix"])
        return (
            rows,
            train_steps(rows, hyper),
            train_minutes(rows, hyper, self.row_seconds()[0], self.est["overhead_minutes"]),
        )

    def sampling(self, corpus: str) -> float:
        c = self.cfg["corpora"][corpus]
        if c["policy"] == "reference":
            return 0.0
        return generate_minutes(
            self.pool_rows(c["pool"]),
            c["k"],
            c["batch_size"],
            c["max_new_tokens"],
            self.est["decode_step_seconds"],
            self.est["overhead_minutes"],
            c["shards"],
        )

    def readout(self, suite: str, rid: str) -> float:
        """One readout replicate of a declared regime (in the suite's shards) or a prompt
        search's."""
        s = self.cfg["evals"][suite]
        tokens = decoding_of(regime(self.cfg, suite, rid))["max_new_tokens"]  # as it decodes
        return generate_minutes(
            self.pool_rows(s["pool"]),
            1,
            s["batch_size"],
            tokens,
            self.est["decode_step_seconds"],
            self.est["overhead_minutes"],
            s["shards"] if rid in s["regimes"] else 1,  # a search's: rule readout_search, one job
        )

    def readout_files(self, arm: str):
        """(suite, regime, path) of every readout replicate of `arm`."""
        for suite, s in self.cfg["evals"].items():
            for rid, g in s["regimes"].items():
                for r in range(g["replicates"]):  # the suite's unless the regime sets its own
                    yield suite, rid, self.results / paths.readout(suite, arm, rid, r)

    def search_files(self, arm: str) -> dict[Path, tuple[str, str]]:
        """{path: (suite, regime)} of every prompt-search readout of `arm` (the searches that
        read it; two searches of one suite and regime share their files)."""
        out = {}
        for sid, ps in self.cfg.get("prompt_search", {}).items():
            if ps["arm"] != arm:
                continue
            for g in search_regimes(self.cfg, sid):
                for r in range(regime(self.cfg, ps["suite"], g)["replicates"]):
                    out[self.results / paths.readout(ps["suite"], arm, g, r)] = (ps["suite"], g)
        return out

    def guard_files(self, arm: str) -> dict[Path, str]:
        """{path: guard} of every MC guard run on `arm` (each guard's `arms`)."""
        return {
            self.results / paths.guard(gid, arm): gid
            for gid, g in self.cfg.get("mc_guards", {}).items()
            if g["arms"] == "all" or arm in g["arms"]  # filled by config.resolve
        }

    def guard(self, gid: str) -> float:
        """One MC guard run: a forward pass per (item, choice), one at a time."""
        f = Path(self.cfg["mc_guards"][gid]["items"])
        items = mcguard.load_items(f if f.is_absolute() else self.repo / f)
        passes = sum(len(it["choices"]) for it in items)
        return job_minutes(passes * self.est["decode_step_seconds"], self.est["overhead_minutes"])

    def searched(self, arm: str, on_disk: bool) -> float:
        """GPU-minutes of `arm`'s prompt-search readouts: pending ones estimated, or those on
        disk as measured."""
        files = self.search_files(arm).items()
        if not on_disk:
            return sum((self.readout(*sg) for p, sg in files if not p.exists()), 0.0)
        return sum((self.measured_readout(p, *sg) for p, sg in files if p.exists()), 0.0)

    def guarded(self, arm: str, on_disk: bool) -> float:
        """GPU-minutes of `arm`'s MC guard runs: pending ones estimated, or those on disk as
        measured."""
        files = self.guard_files(arm).items()
        if not on_disk:
            return sum((self.guard(g) for p, g in files if not p.exists()), 0.0)
        return sum((self.measured_guard(p, g) for p, g in files if p.exists()), 0.0)

    def measured_readout(self, path: Path, suite: str, rid: str) -> float:
        """A readout on disk: its recorded seconds of work (arenaflow.evals.readout writes them in
        the
        parquet's metadata) + the per-job overhead; the estimate for one without them."""
        from arenaflow.evals import readout_file  # pandas-heavy: only when a readout is on disk

        seconds = readout_file.readout_meta(path).get("seconds")
        if seconds is None:
            return self.readout(suite, rid)
        return job_minutes(seconds, self.est["overhead_minutes"])

    def measured_guard(self, path: Path, gid: str) -> float:
        """A guard on disk: its recorded seconds (arenaflow.evals.mcguard) + the per-job
        overhead."""
        try:
            seconds = json.loads(path.read_text()).get("seconds")
        except (OSError, json.JSONDecodeError):
            seconds = None
        if seconds is None:
            return self.guard(gid)
        return job_minutes(seconds, self.est["overhead_minutes"])

    def sampling_pending(self, corpus: str) -> bool:
        return (
            self.cfg["corpora"][corpus]["policy"] != "reference"
            and not (self.results / "candidates" / corpus / "samples.jsonl").exists()
        )

    # ---- arms --------------------------------------------------------------------------
    def priority(self, arm: str) -> float:
        return float(self.cfg["arms"][arm]["priority"])

    def estimate(self, arm: str) -> ArmEstimate:
        if arm not in self._estimates:
            a = self.cfg["arms"][arm]
            readouts = sum(
                self.readout(s, g) for s, g, p in self.readout_files(arm) if not p.exists()
            )
            caused = dict(search=self.searched(arm, False), guards=self.guarded(arm, False))
            if (
                a["kind"] != TRAINED
            ):  # made on CPU from its parents (a merge, a nominee): only its readouts use GPUs
                self._estimates[arm] = ArmEstimate(
                    arm=arm,
                    priority=self.priority(arm),
                    gpus=1,
                    rows=0,
                    steps=0,
                    train=0.0,
                    readouts=readouts,
                    corpus="-",
                    sampling=0.0,
                    needs=self.pending_of(a["parents"]),
                    **caused,
                )
                return self._estimates[arm]
            rows, steps, train = self.train(arm)
            policies = [self.cfg["corpora"][c]["policy"] for c in a["mix"]]
            samplings = {c: self.sampling(c) for c in a["mix"] if self.sampling_pending(c)}
            self._estimates[arm] = ArmEstimate(
                arm=arm,
                priority=self.priority(arm),
                gpus=gpus(a["hyper"]),
                rows=rows,
                steps=steps,
                train=train,
                readouts=readouts,
                corpus=a["corpus"],
                sampling=sum(samplings.values()),
                needs=self.pending_of([a["init"], *policies]),
                samplings=samplings,
                **caused,
            )
        return self._estimates[arm]

    def pending_of(self, arms) -> list[str]:
        """The pending arms among `arms` ('base' and 'reference' are never pending)."""
        return [d for d in dict.fromkeys(arms) if d in self.cfg["arms"] and self.pending(d)]

    def pending_arms(self) -> list[str]:
        return [a for a in sorted(self.cfg["arms"]) if self.pending(a)]

    def gate_arms(self, arm: str) -> list[str]:
        """The arms costed together when the workflow gates `arm`: `arm`, its lineage (init and
        corpus-policy ancestors), and, for each round with `arm` among its candidates, every arm
        of that round (incumbent, control, the other candidates) with its lineage. A function of
        the config alone: whatever target makes the DAG hold `arm`, it holds this set's pending
        arms too, except a candidate's siblings when the target is the candidate alone (counting
        them is the safe side: the round's nomination needs them all)."""
        arms = self.cfg["arms"]
        out = {arm, *arms[arm]["lineage"]}
        for rnd in self.cfg["rounds"].values():
            members = [rnd["incumbent"], *rnd["candidates"], rnd.get("control")]
            if arm in rnd["candidates"]:
                for a in members:
                    if a in arms:
                        out |= {a, *arms[a]["lineage"]}
        return sorted(out)

    def cost(self, arms) -> float:
        """GPU-minutes of running `arms` (pending ones; a shared corpus is sampled once)."""
        ests = [self.estimate(a) for a in arms if self.pending(a)]
        corpora = {c: m for e in ests for c, m in e.sampled().items()}
        return sum(e.own for e in ests) + sum(corpora.values())

    # ---- spending ----------------------------------------------------------------------
    def spent(self) -> dict:
        over = self.est["overhead_minutes"]
        measured = sum(record_minutes(r, over) for _, r in self.history())
        on_disk, searched = 0.0, 0.0
        for suite, s in self.cfg["evals"].items():
            for rid in s["regimes"]:
                n = len(list(self.results.glob(self._readout_glob(suite, rid))))
                on_disk += n * self.readout(suite, rid)
            for rid in s.get("prompt_regimes", {}):  # a search's, whichever arm it read
                for p in sorted(self.results.glob(self._readout_glob(suite, rid))):
                    searched += self.measured_readout(p, suite, rid)
        for corpus in self.cfg["corpora"]:
            if (self.results / "candidates" / corpus / "samples.jsonl").exists():
                on_disk += self.sampling(corpus)
        guarded = sum(
            self.measured_guard(p, gid)
            for gid in self.cfg.get("mc_guards", {})
            for p in sorted(self.results.glob(paths.GUARD.format(guard=gid, rarm="*")))
        )
        before = self.settings["spent_gpu_minutes"]
        return {
            "before": before,
            "training_measured": measured,
            "generation_estimated": on_disk,
            "search_readouts_measured": searched,
            "mc_guards_measured": guarded,
            "runs": len(self.history()),
            "total": before + measured + on_disk + searched + guarded,
        }

    @staticmethod
    def _readout_glob(suite: str, rid: str) -> str:
        return paths.READOUT.format(suite=suite, rarm="*", regime=rid, rep="*")

    def left(self) -> float:
        return self.settings["gpu_minutes"] - self.spent()["total"]

    def check(self, arms, arm: str) -> None:
        """Raise BudgetError when running the pending arms in `arms` (the ones this run needs so
        far, `arm` the last one added) would overrun what is left of the budget."""
        need, left = self.cost(arms), self.left()
        if need <= left + 1e-9:
            return
        e = self.estimate(arm)
        others = sorted(a for a in arms if a != arm and self.pending(a))
        with_others = (
            (f"; with the other pending arms this run needs ({', '.join(others)}) {need:.1f}")
            if others
            else ""
        )
        raise BudgetError(
            f"GPU-minute budget: arm {arm!r} would overrun the budget: its estimate is "
            f"{e.own + e.sampling:.1f} GPU-minutes (training {e.train:.1f}, "
            f"readouts {e.readouts:.1f}"
            f"{f', prompt-search readouts {e.search:.1f}' if e.search else ''}"
            f"{f', MC guards {e.guards:.1f}' if e.guards else ''}"
            f"{f', sampling corpus {e.corpus} {e.sampling:.1f}' if e.sampling else ''})"
            f"{with_others}, "
            f"and {left:.1f} of {self.settings['gpu_minutes']:.1f} GPU-minutes are left. "
            "Nothing was submitted. "
            "`python -m arenaflow.budget.plan` lists the pending arms with their estimates and "
            "picks the ones that fit; raise budget.gpu_minutes only if the allocation allows it."
        )
