"""Joining the job: rendezvous, the process groups a worker uses, and agreement on the plan.

- Local launch (``skippipe train``): the launcher hosts the rendezvous store and every worker
  connects to it as a client (``SKIPPIPE_STORE_HOSTED=1``).
- ``torchrun``: its agent hosts the store (``TORCHELASTIC_USE_AGENT_STORE=True``); torch's
  ``env://`` handler connects.
- Otherwise rank 0 hosts the store at ``MASTER_ADDR:MASTER_PORT``.

A hosted store listens on ``MASTER_ADDR`` only (``host_store``), never on every interface. A
client first waits, quietly, until the store's port accepts connections (``wait_reachable``), so
an unreachable rendezvous is one line after ``rendezvous_timeout_s``, not a stream of library
retry warnings. Library errors in collectives become typed faults (``communicating``).

Groups: the default group (barriers, loss/norm all-reduce), a gloo group for message headers
(received from any peer), the payload group (the same gloo group, or NCCL for CUDA tensors) and
one group per stage for gradient averaging (on the payload backend: NCCL syncs gradients on the GPU).

Directed links (always with NCCL): NCCL runs a communicator's operations in order on one CUDA
stream, and a send waits for its matching receive. If node A's sender thread and node B's sender
thread both send a large tensor to each other on one communicator, each receive is queued behind
that node's own send and neither send ever completes. So every ordered pair (src, dst) that
exchanges messages in the plan gets its own two-rank group, carrying payloads from src to dst
only: on each communicator one side only sends and the other only receives, in the order the
headers arrived (messages between one pair are FIFO), so nothing can wait on itself.
``link_pairs`` lists the pairs, ``Groups.payload_for(src, dst)`` picks the group.

Shared GPUs: NCCL allows one rank per GPU in a communicator ("Duplicate GPU detected"). Workers
that share a GPU (more workers than GPUs on a machine) are found by comparing every worker's
host and GPU UUID (``gather_gpu_keys``); a group holding two of them uses gloo instead
(``group_backend``), and its payloads travel through host memory.
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import os
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from skippipe.errors import MessageTimeout, PeerLost, UserError
from skippipe.runtime import faultpoint
from skippipe.runtime.faults import first_line
from skippipe.runtime.torchrun_restart import restart_count


@dataclass
class Env:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    torchrun: bool  # started by torchrun (its agent hosts the store)
    hosted: bool  # a launcher hosts the store; every worker is a client


def read_env() -> Env:
    """Rank, world size and rendezvous address from the environment (torchrun's variables)."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise UserError(
            f"worker: environment variable(s) {', '.join(missing)} are not set; start workers with "
            "`skippipe train` or `torchrun ... -m skippipe.cli worker CONFIG`"
        )
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        port = int(os.environ["MASTER_PORT"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise UserError("worker: RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT must be integers") from None
    if not 0 <= rank < world:
        raise UserError(f"worker: RANK={rank} is outside 0..WORLD_SIZE-1={world - 1}")
    return Env(
        rank=rank, world_size=world, local_rank=local, master_addr=os.environ["MASTER_ADDR"], master_port=port,
        torchrun=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or "TORCHELASTIC_RUN_ID" in os.environ,
        hosted=os.environ.get("SKIPPIPE_STORE_HOSTED") == "1",
    )


def listen_socket(addr: str, port: int) -> socket.socket:
    """A listening TCP socket bound to ``addr`` only (not every interface), for a TCPStore."""
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UserError(f"cannot host the rendezvous at {addr}:{port}: {exc.strerror}") from None
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(512)
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot host the rendezvous at {addr}:{port}: {exc.strerror}") from None
    return sock


def host_store(addr: str, port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """A TCPStore server listening on ``addr`` only; port 0 picks a free one (``store.port``).
    The store owns the listening socket (it closes it when it goes)."""
    sock = listen_socket(addr, port)
    try:
        store = dist.TCPStore(
            addr, sock.getsockname()[1], world_size, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False, master_listen_fd=sock.fileno(),
        )
    except (RuntimeError, OSError, ValueError) as exc:
        sock.close()
        raise UserError(f"cannot host the rendezvous at {addr}:{port}: {first_line(exc, 200)}") from None
    sock.detach()  # the store closes the descriptor
    return store


def wait_reachable(addr: str, port: int, timeout_s: float, world_size: int) -> None:
    """Return once ``addr:port`` accepts a TCP connection; after ``timeout_s`` one-line
    ``UserError`` (quiet: no library retry warnings, and the timeout is kept)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((addr, port), timeout=max(0.1, min(left, 2.0))):
                return
        except OSError:
            pass
        if time.monotonic() + 0.2 >= deadline:
            raise UserError(
                f"cannot reach the rendezvous at {addr}:{port} within {timeout_s:g} s (are all {world_size} workers started?)"
            )
        time.sleep(0.2)


def init(env: Env, timeout_s: float, rendezvous_timeout_s: float) -> dist.TCPStore | None:
    """Join the default (gloo) group; unreachable rendezvous -> one-line UserError. Returns the
    store this rank hosts (keep a reference while the job runs), else None."""
    where = f"{env.master_addr}:{env.master_port}"
    pg_timeout = datetime.timedelta(seconds=timeout_s)
    t0 = time.monotonic()
    try:
        if env.torchrun:
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
            wait_reachable(env.master_addr, env.master_port, rendezvous_timeout_s, env.world_size)
            timeout = datetime.timedelta(seconds=max(timeout_s, rendezvous_timeout_s))
            # the agent's store outlives a restart (``--max-restarts``): the keys of each attempt
            # go under their own prefix, or a restarted group reads the dead one's addresses
            agent = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=False, timeout=timeout)
            store = dist.PrefixStore(f"skippipe/attempt-{restart_count(os.environ)}", agent)
            dist.init_process_group("gloo", store=store, rank=env.rank, world_size=env.world_size, timeout=timeout)
            return None
        if env.rank == 0 and not env.hosted:
            store = host_store(env.master_addr, env.master_port, env.world_size, rendezvous_timeout_s)
        else:
            wait_reachable(env.master_addr, env.master_port, rendezvous_timeout_s, env.world_size)
            left = max(1.0, rendezvous_timeout_s - (time.monotonic() - t0))
            store = dist.TCPStore(
                env.master_addr, env.master_port, env.world_size, is_master=False,
                timeout=datetime.timedelta(seconds=left), wait_for_workers=False,
            )
        store.set_timeout(datetime.timedelta(seconds=rendezvous_timeout_s))
        dist.init_process_group("gloo", store=store, rank=env.rank, world_size=env.world_size, timeout=pg_timeout)
        return store if env.rank == 0 and not env.hosted else None
    except (RuntimeError, ValueError, OSError) as exc:
        if time.monotonic() - t0 >= 0.9 * rendezvous_timeout_s:
            raise UserError(
                f"not all {env.world_size} workers joined the rendezvous at {where} within {rendezvous_timeout_s:g} s"
            ) from None
        raise UserError(f"cannot join the job at {where}: {first_line(exc, 200)}") from None


@contextmanager
def communicating(what: str, timeout_s: float, fault: tuple[str, int] | None = None) -> Iterator[None]:
    """Around collectives (barriers, all-reduces): a library error becomes ``MessageTimeout``
    (it took the whole timeout: some peer went silent) or ``PeerLost`` (a connection broke).
    ``fault``: a test's fault point (``faultpoint.py``) and step, checked on entry."""
    if fault is not None:
        faultpoint.hit(fault[0], dist.get_rank(), fault[1])
    t0 = time.monotonic()
    try:
        yield
    except RuntimeError as exc:
        if time.monotonic() - t0 >= 0.9 * timeout_s:
            raise MessageTimeout((), timeout_s, f"{what} did not complete") from None
        raise PeerLost(None, f"{what}: {first_line(exc, 200)}") from None


@dataclass
class Groups:
    world: dist.ProcessGroup
    header: dist.ProcessGroup  # gloo, point-to-point headers (any-source receives)
    payload: dist.ProcessGroup  # gloo or NCCL, point-to-point tensors
    stage: dist.ProcessGroup | None  # this node's stage group (None: the stage has one node)
    stage_ranks: list[int]
    links: dict[tuple[int, int], dist.ProcessGroup] = field(default_factory=dict)  # (src, dst) -> its own group
    gloo_instead: int = 0  # groups on gloo although the backend is NCCL: their workers share a GPU

    def payload_for(self, src: int, dst: int) -> dist.ProcessGroup:
        """The group that carries payloads from ``src`` to ``dst``."""
        return self.links.get((src, dst), self.payload)


def link_pairs(routes: Iterable[Sequence[int]]) -> list[tuple[int, int]]:
    """Every ordered pair (src, dst) that carries a message, sorted: each route (data node, path...)
    sends activations along it and back to its data node, and gradients the other way."""
    pairs: set[tuple[int, int]] = set()
    for route in routes:
        if len(route) < 2:
            continue
        ring = list(route) + [route[0]]
        for a, b in itertools.pairwise(ring):
            pairs.update({(a, b), (b, a)})
    return sorted(pairs)


def gpu_key(device: torch.device) -> int:
    """The identity of a worker's GPU across machines (host name and GPU UUID, hashed); -1 off CUDA."""
    if device.type != "cuda":
        return -1
    props = torch.cuda.get_device_properties(device)
    ident = f"{socket.gethostname()}/{getattr(props, 'uuid', device.index)}"
    return int.from_bytes(hashlib.sha256(ident.encode()).digest()[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def gather_gpu_keys(device: torch.device, timeout_s: float) -> list[int]:
    """Every rank's ``gpu_key``, in rank order (all ranks call this)."""
    mine = torch.tensor([gpu_key(device)], dtype=torch.int64)
    out = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    with communicating("comparing the GPUs of all workers", timeout_s):
        dist.all_gather(out, mine)
    return [int(v) for v in out]


def group_backend(backend: str, ranks: Iterable[int], gpu_keys: Sequence[int] | None) -> str:
    """``backend``, except gloo for an NCCL group in which two ranks share a GPU."""
    if backend != "nccl" or gpu_keys is None:
        return backend
    keys = [gpu_keys[r] for r in ranks]
    return backend if len(set(keys)) == len(keys) else "gloo"


def make_groups(
    stages: list[list[int]], rank: int, backend: str, links: Sequence[tuple[int, int]] = (), directed: bool | None = None,
    gpu_keys: Sequence[int] | None = None,
) -> Groups:
    """Every rank creates every group, in the same order (torch.distributed's rule). ``links``
    (``link_pairs``) get one group per direction when ``directed`` (default: with NCCL).
    ``gpu_keys`` (``gather_gpu_keys``): groups whose ranks share a GPU use gloo (``group_backend``)."""
    world = dist.group.WORLD
    header = dist.new_group(backend="gloo")
    fallbacks = 0

    def new(ranks: Sequence[int]) -> dist.ProcessGroup:
        nonlocal fallbacks
        chosen = group_backend(backend, ranks, gpu_keys)
        fallbacks += chosen != backend
        return dist.new_group(ranks=list(ranks), backend=chosen)

    payload = header
    if backend == "nccl":
        everyone = range(dist.get_world_size())
        payload = dist.new_group(backend="nccl") if group_backend(backend, everyone, gpu_keys) == "nccl" else header
    mine = None
    my_ranks: list[int] = []
    for nodes in stages:
        ranks = sorted(nodes)
        g = new(ranks) if len(ranks) > 1 else None
        if rank in ranks:
            mine, my_ranks = g, ranks
    own: dict[tuple[int, int], dist.ProcessGroup] = {}
    for src, dst in links if (backend == "nccl" if directed is None else directed) else ():
        g = new(sorted((src, dst)))
        if rank in (src, dst):
            own[(src, dst)] = g
    return Groups(world=world, header=header, payload=payload, stage=mine, stage_ranks=my_ranks, links=own,
                  gloo_instead=fallbacks)


def agree(text: str, what: str, timeout_s: float) -> None:
    """All ranks hold the same ``text`` (e.g. the plan); otherwise a UserError naming a rank."""
    digest = hashlib.sha256(text.encode()).digest()[:8]
    mine = torch.tensor([int.from_bytes(digest, "big", signed=True)], dtype=torch.int64)
    out = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    with communicating(f"comparing the {what} of all workers", timeout_s):
        dist.all_gather(out, mine)
    for r, v in enumerate(out):
        if int(v) != int(out[0]):
            raise UserError(f"rank {r} has a different {what} than rank 0; every worker must use the same one")


def device_for(spec: str, local_rank: int) -> torch.device:
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(f"runtime: device {spec!r} asked for, but CUDA is not available")
    # "cuda": one GPU per local worker; with fewer GPUs than workers, workers share them
    return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}") if spec == "cuda" else torch.device(spec)


def shutdown() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # already broken by a failed peer: nothing left to clean
            pass
