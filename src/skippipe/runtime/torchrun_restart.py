"""Under ``torchrun --max-restarts N``: a restarted worker group resumes from the last checkpoint.

torchrun's elastic agent watches its workers. When one exits with an error (a crash, a SIGKILL,
a lost peer), it stops the others of its group and, while ``--max-restarts`` allows, starts the
whole group again after a new rendezvous, with ``TORCHELASTIC_RESTART_COUNT`` one higher (with
``--rdzv-backend c10d`` the agents of every machine take part). The command line is the same each
time, so ``--resume`` cannot be on it: the first start has no checkpoint and ``--resume`` then
stops with one line. A worker started again (restart count > 0) therefore resumes by itself
from ``RUN/checkpoints`` when it holds one (the shared checkpoint storage every worker reads
alike, so all decide the same), and starts from step 0 when the failure came before the first
checkpoint. Iterations after the checkpoint are redone; ``metrics.jsonl`` drops their records.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping

RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"


def restart_count(environ: Mapping[str, str]) -> int:
    """How many times torchrun restarted this worker group (0: the first start, or not torchrun)."""
    value = environ.get(RESTART_ENV, "0")
    return int(value) if value.isdigit() else 0


def resume_on_restart(resume: bool, environ: Mapping[str, str], has_checkpoint: bool, shared_storage: bool) -> bool:
    """Whether the worker resumes: asked to (``--resume``), or restarted by torchrun with a shared
    checkpoint there to resume from."""
    return resume or (restart_count(environ) > 0 and has_checkpoint and shared_storage)
