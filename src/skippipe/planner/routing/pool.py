"""Worker processes for independent searches of one plan (``WorkerPool``): the groups of a
cluster (``workers.GroupPlanner``), the searches around slow links from several allocations
(``candidates.slow_link_candidate``), and through ``map_calls`` the timetables of several
allocations (``timetabled.timetable_candidates``) and the data-node exchanges of one step
(``data_nodes.data_node_search``).

``planning_workers()`` processes (2 by default; the environment variable
``SKIPPIPE_PLANNING_WORKERS`` sets another count, 1 makes everything in this process). Every
call handed to them is a function of its arguments alone (counted budgets, seeded searches),
so the results are the same whatever the count: only the wall-clock time changes. The
workers are forked, so nothing is imported again and scripts need no ``__main__`` guard; only
from a process that runs one thread (a process with threads of its own, such as a training
run replanning, makes every call here, one after another), only on Linux (where fork is the
default and safe for a process without threads) and never from inside a worker. Where a
worker dies (killed, out of memory), its calls are made here.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Generic, TypeVar

from skippipe.errors import UserError

WORKERS_ENV = "SKIPPIPE_PLANNING_WORKERS"
DEFAULT_WORKERS = 2
MAX_WORKERS = 64
_IN_WORKER = False  # set in the worker processes: they make their calls here

T = TypeVar("T")
P = TypeVar("P", bound="WorkerPool")


def planning_workers() -> int:
    """The worker processes a pool may use: ``SKIPPIPE_PLANNING_WORKERS`` (1 to
    ``MAX_WORKERS``), else ``DEFAULT_WORKERS``."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if not raw:
        return DEFAULT_WORKERS
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_WORKERS:
        raise UserError(f"{WORKERS_ENV} must be a whole number from 1 to {MAX_WORKERS}, got {raw!r}")
    return int(raw)


def cpu_seconds() -> float:
    """CPU seconds of this process and of its ended child processes (the workers once their
    pool is closed): what planning cost on every core, where the wall clock shows less."""
    import resource  # Unix only, as the workers are

    own, ended = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime


def _mark_worker() -> None:
    global _IN_WORKER
    _IN_WORKER = True


# ``map_calls`` makes a batch estimated below this many seconds here: forking the workers and
# sending the calls cost more than half of that from a large process (the tests' runner, which
# holds torch: 8.6 s more wall clock, 8.9 s more system time, on 46 planning tests)
SIDE_BY_SIDE_S = 0.3


def map_calls(work: Callable[..., T], calls: list[tuple], estimated_s: float | None = None) -> list[T]:
    """``[work(*args) for args in calls]``, the calls side by side in the planning workers where
    there are two or more and their ``estimated_s`` (seconds, all of them) is at least
    ``SIDE_BY_SIDE_S`` (from inside a worker, or with one worker, all of them here); the results
    in the order of ``calls``."""
    apart = len(calls) > 1 and (estimated_s is None or estimated_s >= SIDE_BY_SIDE_S)
    with WorkerPool(workers=None if apart else 1) as pool:
        pending = [pool.submit(work, *args) for args in calls]
        return [p.result() for p in pending]


def split(items: list[T], parts: int) -> list[list[T]]:
    """``items`` in at most ``parts`` runs of consecutive items, as even as can be, in order."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, at = [], 0
    for k in range(parts):
        n = size + (1 if k < extra else 0)
        out.append(items[at:at + n])
        at += n
    return out


class Pending(Generic[T]):
    """A call handed to the workers (``WorkerPool.submit``); ``result`` makes it here when a
    worker died (a process killed, say), so a plan never depends on the workers."""

    def __init__(self, future: Future[T] | None, work: Callable[..., T], args: tuple, kwargs: dict) -> None:
        self.future, self._call = future, (work, args, kwargs)

    def result(self) -> T:
        work, args, kwargs = self._call
        if self.future is not None:
            try:
                return self.future.result()
            except BrokenProcessPool:
                pass
        return work(*args, **kwargs)


class WorkerPool:
    """Calls made in worker processes where that is allowed (see the module text), else here;
    a context manager that shuts its workers down."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = planning_workers() if workers is None else workers
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> bool:
        """Fork the workers now, if allowed and not yet done; whether work goes to workers."""
        if self._pool is None and self.workers > 1:
            allowed = (sys.platform.startswith("linux") and not _IN_WORKER and threading.active_count() == 1
                       and "fork" in multiprocessing.get_all_start_methods())
            if not allowed:
                self.workers = 1
                return False
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"),
                                             initializer=_mark_worker)
            self._pool.submit(_mark_worker).result()  # forks every worker (fork context), then a thread starts
        return self._pool is not None

    def submit(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> Pending[T]:
        """``work(*args, **kwargs)`` handed to a worker when the pool has workers (forked
        first; the call must pickle), else made here when its result is asked for."""
        if self.start():
            assert self._pool is not None
            try:
                return Pending(self._pool.submit(work, *args, **kwargs), work, args, kwargs)
            except BrokenProcessPool:  # a worker died: the rest is made here
                self.close()
                self.workers = 1
        return Pending(None, work, args, kwargs)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def stop(self) -> None:
        """End the workers now, whatever they are running (their calls are lost)."""
        if self._pool is not None:
            for process in list((getattr(self._pool, "_processes", None) or {}).values()):
                process.terminate()
            self.close()

    def __enter__(self: P) -> P:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def raise_first_error(self, futures: list[Future | None]) -> None:
        """Wait for ``futures`` until one fails; then stop the workers and raise its error."""
        running = [f for f in futures if f is not None]
        done, _ = wait(running, return_when=FIRST_EXCEPTION)
        errors = [e for f in running if f in done and not f.cancelled() and isinstance(e := f.exception(), UserError)]
        if errors and len(done) < len(running):  # else the results are taken in order (a dead worker's calls made here)
            self.stop()
            raise errors[0]
