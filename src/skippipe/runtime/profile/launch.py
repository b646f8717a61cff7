"""Local launch of ``skippipe profile``: one worker process per node on this machine.

The launcher hosts the rendezvous store on a free port and starts each worker, forked from a
server that imported torch once, with torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); the worker runs exactly what
``torchrun ... -m skippipe.cli profile --worker`` runs (``ProfileSpec.to_argv`` gives its
flags). A worker that fails stops the others and the error names it. Worker output goes to a
temporary folder, removed afterwards.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

from skippipe.errors import UserError
from skippipe.runtime.launch import redirect_output
from skippipe.runtime.process_group import host_store
from skippipe.runtime.profile.spec import ProfileSpec
from skippipe.runtime.profile.worker import PROGRESS_ENV, PROGRESS_KEY, run_profile_worker, total_rounds


class ProfileFailed(UserError):
    """A profile worker failed or the profile did not finish in time."""

    exit_code = 3


def _child(env: dict[str, str], log: str, spec: ProfileSpec) -> None:
    """A forked worker: torchrun's environment, output to its log, then what ``skippipe profile
    --worker`` runs; a failure is its last line."""
    redirect_output(log)
    os.environ.update(env)
    try:
        code = run_profile_worker(spec)
    except UserError as exc:
        print(" ".join(str(exc).split()), file=sys.stderr)
        code = exc.exit_code
    except Exception as exc:  # a crash or a lost peer: its one-line cause for the launcher
        print(f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _last_line(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _failure(rank: int, procs: list[multiprocessing.process.BaseProcess], logs: list[Path]) -> ProfileFailed:
    return ProfileFailed(f"profile worker {rank} failed (exit {procs[rank].exitcode}): {_last_line(logs[rank]) or 'no output'}")


def launch_profile(spec: ProfileSpec, nodes: int, deadline_s: float, show_progress: bool = True) -> None:
    """Run the profile with ``nodes`` local workers; rank 0 writes ``spec.out``."""
    from tqdm import tqdm

    if nodes < 2:
        raise UserError(f"profile: --nodes must be at least 2, got {nodes}")
    store = host_store("127.0.0.1", 0, nodes + 1, spec.rendezvous_timeout_s)  # listens on 127.0.0.1 only
    store.set(PROGRESS_KEY, "0")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "skippipe.runtime.profile.worker"])
    base = {
        "WORLD_SIZE": str(nodes), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "SKIPPIPE_STORE_HOSTED": "1",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "LOCAL_WORLD_SIZE": str(nodes),
        PROGRESS_ENV: "1",
    }
    procs: list[multiprocessing.process.BaseProcess] = []
    with tempfile.TemporaryDirectory(prefix="skippipe-profile-") as tmp:
        logs = [Path(tmp) / f"node-{r:03d}.log" for r in range(nodes)]
        bar = tqdm(total=total_rounds(nodes), desc="profiling", unit="round", disable=None if show_progress else True,
                   leave=False, file=sys.stderr)
        try:
            for r in range(nodes):
                env = dict(base, RANK=str(r), LOCAL_RANK=str(r))
                p = ctx.Process(target=_child, args=(env, str(logs[r]), spec), name=f"skippipe-profile-{r}")
                p.start()
                procs.append(p)
            end = time.monotonic() + deadline_s
            while any(p.exitcode is None for p in procs):
                failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if failed:
                    time.sleep(0.5)  # let near-simultaneous exits land, then name the first
                    raise _failure(failed[0], procs, logs)
                if time.monotonic() > end:
                    raise ProfileFailed(f"the profile did not finish within {deadline_s:.0f} s")
                bar.n = int(store.add(PROGRESS_KEY, 0))
                bar.refresh()
                time.sleep(0.1)
            bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
            if bad:
                raise _failure(bad[0], procs, logs)
        finally:
            bar.close()
            for p in procs:
                if p.exitcode is None:
                    p.terminate()
            for p in procs:
                p.join(5)
                if p.exitcode is None:
                    p.kill()
                    p.join()
            del store
