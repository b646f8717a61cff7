"""Independent training jobs in parallel worker processes (one torch thread each).

The experts of HDEE never talk to each other while they train, so each is its own process
(here; its own machine or pipeline in a deployment). Workers send their progress lines through
a queue and the parent prints them as they come. With ``jobs = 1`` everything runs in this
process, one job after another.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

from skippipe.hdee.train import JobResult, JobSpec, run_job


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def _work(spec: JobSpec, run_dir: str, until: int | None, progress: queue_module.Queue) -> JobResult:
    return run_job(spec, run_dir, until=until, report=progress.put)


def run_jobs(
    specs: list[JobSpec], run_dir: str | Path, jobs: int = 1, until: int | None = None,
    log: Callable[[str], None] = print,
) -> list[JobResult]:
    """Run every job (finished ones are skipped); results in the order of ``specs``."""
    if not specs:
        return []
    if jobs <= 1 or len(specs) == 1:
        from skippipe.hdee.data import load_run_data

        data = load_run_data(run_dir)
        return [run_job(s, run_dir, data=data, until=until, report=log) for s in specs]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        progress = manager.Queue()
        with ProcessPoolExecutor(max_workers=min(jobs, len(specs)), mp_context=ctx, initializer=_init_worker) as pool:
            futures: dict[Future, int] = {pool.submit(_work, s, str(run_dir), until, progress): i for i, s in enumerate(specs)}
            results: list[JobResult | None] = [None] * len(specs)
            pending = set(futures)
            try:
                while pending:
                    finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                    _drain(progress, log)
                    for f in finished:
                        results[futures[f]] = f.result()  # a worker's error is raised here
            except BaseException:
                for f in pending:
                    f.cancel()
                raise
            _drain(progress, log)
    return [r for r in results if r is not None]


def _drain(progress: queue_module.Queue, log: Callable[[str], None]) -> None:
    while True:
        try:
            log(progress.get_nowait())
        except queue_module.Empty:
            return
