"""One run in every tracker asked for: each backend on a thread of its own, behind a bounded
queue, so the job's thread only enqueues (Worker); a backend that fails is dropped with one
warning; the job ends without waiting on a tracker for more than 1 % of its time (Run.close)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

log = logging.getLogger("arenaflow.tracking")

# Records a backend may fall behind by before new ones are dropped (a stalled server must not
# grow the job's memory): a training logging every step for a day at 10 steps/s stays under it
# while its backend keeps up at all.
QUEUE_SIZE = 10_000
# The least a training's end waits for its trackers: 1 % of a minute's CPU test training is
# 0.3 s, less than a file store's flush takes on a loaded machine.
MIN_WAIT_S = 2.0
_STOP = object()


class Worker:
    """A backend on its own daemon thread: `make()` builds it there (an import, a server's
    first request), then each queued call runs on it. The first exception, or a queue that is
    full, warns once and turns the worker off; the job never sees it."""

    def __init__(self, name: str, make: Callable[[], object]):
        self.name, self.alive, self.warned = name, True, False
        self.queue: queue.Queue = queue.Queue(QUEUE_SIZE)
        self.thread = threading.Thread(
            target=self._serve, args=(make,), name=f"tracking-{name}", daemon=True
        )
        self.thread.start()

    def call(self, method: str, *args) -> None:
        if not self.alive:
            return
        try:
            self.queue.put_nowait((method, args))
        except queue.Full:
            self.fail(f"{QUEUE_SIZE} records behind")

    def fail(self, why: str) -> None:
        self.alive = False
        if not self.warned:
            self.warned = True
            log.warning("tracker %s: %s; it is off for the rest of this job", self.name, why)

    def _serve(self, make) -> None:
        try:
            backend = make()
            while (item := self.queue.get()) is not _STOP:
                if self.alive:
                    getattr(backend, item[0])(*item[1])
                self.queue.task_done()
            backend.close()
        except Exception as e:  # any failure of a tracker: the job goes on without it
            self.fail(f"{type(e).__name__}: {e}")

    def idle(self) -> bool:
        """Whether everything queued so far is written (or dropped)."""
        return not self.alive or self.queue.unfinished_tasks == 0

    def stop(self) -> None:
        """Ask the thread to finish what is queued and close (without waiting for it)."""
        try:
            self.queue.put_nowait(_STOP)
        except queue.Full:
            self.fail(f"{QUEUE_SIZE} records behind")

    def join(self, end: float, wait_s: float) -> None:
        """Wait for the thread until `end` (time.monotonic()); warn if it is still writing."""
        self.thread.join(max(end - time.monotonic(), 0.0))
        if self.alive and self.thread.is_alive():
            self.fail(f"did not finish within {wait_s:.2f} s; what it held is dropped")


class Throttle:
    """Whether a training step is logged: every `every_steps` steps and at most once per
    `min_interval_s`; a forced step (the last, a held-out evaluation) always."""

    def __init__(self, every_steps: int, min_interval_s: float):
        self.every, self.interval, self.last = every_steps, min_interval_s, -float("inf")

    def due(self, step: int, force: bool = False) -> bool:
        now = time.monotonic()
        if force or (step % self.every == 0 and now - self.last >= self.interval):
            self.last = now
            return True
        return False


class Run:
    """A run in every backend: log_params, log_metrics(step), close. No backend: does nothing."""

    def __init__(self, workers: list[Worker], every_steps: int, min_interval_s: float):
        self.workers = workers
        self.throttle = Throttle(every_steps or 1, min_interval_s)
        self.t0 = time.monotonic()

    def __bool__(self) -> bool:
        return bool(self.workers)

    def log_params(self, params: dict) -> None:
        for w in self.workers:
            w.call("log_params", params)

    def log_metrics(self, metrics: dict, step: int) -> None:
        """Numbers only (a None, a missing grad norm, is left out)."""
        metrics = {k: float(v) for k, v in metrics.items() if v is not None}
        for w in self.workers:
            w.call("log_metrics", metrics, step)

    def close(self, wait_s: float | None = None) -> None:
        """Flush and close every backend, waiting for them together at most `wait_s`; None, 1 %
        of the time since the run opened or MIN_WAIT_S, whichever is longer: a tracker never
        holds a long training's end longer, and a short one's writers get time to flush."""
        if wait_s is None:
            wait_s = max(0.01 * (time.monotonic() - self.t0), MIN_WAIT_S)
        close_together([self], wait_s)


def close_together(runs: list[Run], wait_s: float) -> None:
    """Flush and close every backend of every run, waiting for all of them at most `wait_s`.
    Every backend flushes at once: closing them in turn let the first spend the others' time."""
    workers = [w for run in runs for w in run.workers]
    for w in workers:
        w.stop()
    end = time.monotonic() + wait_s
    for w in workers:
        w.join(end, wait_s)
