"""Training metrics: one JSON object per iteration in ``metrics.jsonl``, and TensorBoard scalars.

Written by rank 0 only. Each JSONL line is written whole and flushed, so a reader (the progress
bar of ``skippipe train``) never sees half a record; on ``--resume`` the records after the
checkpoint's step are dropped first (the file is rewritten atomically), so the file always
describes one consistent history. TensorBoard event files go to ``RUN/tensorboard/``
(``tensorboard --logdir RUN/tensorboard``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skippipe.fileio import atomic_write_text

METRICS_FILE = "metrics.jsonl"


@dataclass
class IterationStats:
    """What one iteration achieved, the same on every worker."""

    iteration: int  # 1-based count of completed iterations
    loss: float
    lr: float
    grad_norm: float
    iter_s: float  # barrier to optimizer step done (real seconds)
    makespan_s: float  # barrier to the last backward on any data node (real seconds)
    samples: int
    stop: bool = False  # some worker was asked to stop: all stop after this iteration
    peak_memory_bytes: int = 0  # the most any worker's CUDA allocator held so far (0 on CPU)

    def record(self, time_scale: float) -> dict[str, Any]:
        """The ``metrics.jsonl`` record (``makespan_plan_s``: the makespan in plan seconds)."""
        return {
            "iteration": self.iteration, "loss": self.loss, "lr": self.lr, "grad_norm": self.grad_norm,
            "iter_s": self.iter_s, "makespan_s": self.makespan_s, "makespan_plan_s": self.makespan_s / time_scale,
            "samples": self.samples, "samples_per_s": self.samples / self.iter_s,
            "peak_memory_bytes": self.peak_memory_bytes, "time": time.time(),
        }


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All complete records (a torn last line, if any, is ignored)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def truncate_metrics(run_dir: str | Path, after_step: int) -> None:
    """Keep only records of iterations ``<= after_step`` (used when resuming)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return
    kept = [r for r in read_metrics(run_dir) if int(r.get("iteration", 0)) <= after_step]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))


class MetricsWriter:
    def __init__(self, run_dir: str | Path, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", buffering=1)
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard not installed: JSONL only
                SummaryWriter = None  # type: ignore[assignment]
            if SummaryWriter is not None:
                self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        if self._tb is not None:
            step = int(record["iteration"])
            for key, value in record.items():
                if key != "iteration" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(f"train/{key}", value, step)
            self._tb.flush()

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
