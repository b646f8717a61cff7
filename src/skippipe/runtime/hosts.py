"""The host file: which machine runs which plan nodes, for ``torchrun`` on several machines.

``[runtime] hosts = "hosts.toml"`` (relative to the run config) names a file of ``[[host]]`` tables,
one per machine, in the order of torchrun's ``--node-rank``::

    [[host]]
    name = "a100-east"   # a label for messages and logs
    gpus = 4             # GPUs on this machine (0: CPU only)
    nodes = [0, 1, 2, 3] # the plan nodes it runs: start it with --nproc-per-node=4

    [[host]]
    name = "l4-west"
    gpus = 2
    nodes = [4, 5, 6]    # three workers share two GPUs (cuda:0, cuda:1, cuda:0)

Machines may run different numbers of workers. Under torchrun, the worker with ``GROUP_RANK`` g
and ``LOCAL_RANK`` j runs plan node ``hosts[g].nodes[j]`` on GPU ``j % gpus`` and joins the job
with that node as its rank (so torchrun's own rank order does not matter). ``check_hosts`` and
``place`` refuse anything else with one line (``HostFileError``) before any worker joins. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from skippipe.config_fields import check_fields, read_config_file, read_dataclass
from skippipe.errors import HostFileError


@dataclass(frozen=True)
class Host:
    config_label: ClassVar[str] = "host"
    config_error: ClassVar[type[HostFileError]] = HostFileError

    name: str = ""
    gpus: int = field(default=0, metadata={"min": 0})
    nodes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Placement:
    node: int  # the plan node this worker runs (its rank in the job)
    host: str
    gpu: int | None  # the GPU index on its machine (None: the machine has none)


def load_hosts(path: str | Path) -> list[Host]:
    """The ``[[host]]`` tables of ``path`` (TOML or JSON); one-line ``HostFileError`` otherwise."""
    where = str(path)
    data = read_config_file(path, default_format="toml", error=HostFileError, what="host file")
    extra = sorted(str(k) for k in data if k != "host")
    if extra:
        raise HostFileError(f"unknown key(s) {', '.join(extra)} (a host file holds [[host]] tables)", where=where, key=extra[0])
    tables = data.get("host")
    if not isinstance(tables, list) or not tables:
        raise HostFileError("no [[host]] tables (one per machine: name, gpus, nodes)", where=where)
    return [read_dataclass(Host, t, f"{where} [[host]] {i + 1}", error=HostFileError) for i, t in enumerate(tables)]


def check_hosts(hosts: list[Host], n_nodes: int, where: str, cuda: bool = False) -> None:
    """Every plan node 0..n_nodes-1 on exactly one host; names given and unique; GPUs where CUDA is used."""
    seen: dict[int, str] = {}
    names: set[str] = set()
    for i, h in enumerate(hosts):
        label = f"host {i + 1}"
        if not h.name:
            raise HostFileError(f"{label} has no name", where=where, key="name")
        if h.name in names:
            raise HostFileError(f"host name {h.name!r} appears twice", where=where, key="name")
        names.add(h.name)
        if not h.nodes:
            raise HostFileError(f"host {h.name!r} runs no plan nodes (nodes = [...])", where=where, key="nodes")
        if cuda and h.gpus == 0:
            raise HostFileError(f"host {h.name!r} has gpus = 0 but [runtime] device is CUDA", where=where, key="gpus")
        for node in h.nodes:
            if not 0 <= node < n_nodes:
                raise HostFileError(f"host {h.name!r}: node {node} is not in the plan (nodes 0..{n_nodes - 1})", where=where)
            if node in seen:
                raise HostFileError(f"node {node} is placed on both {seen[node]!r} and {h.name!r}", where=where, key="nodes")
            seen[node] = h.name
    missing = [n for n in range(n_nodes) if n not in seen]
    if missing:
        shown = ", ".join(str(n) for n in missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise HostFileError(f"plan node(s) {shown} are on no host ({len(missing)} of {n_nodes})", where=where)


def place(hosts: list[Host], where: str, group_rank: int, group_world: int, local_rank: int, local_world: int) -> Placement:
    """The plan node of torchrun worker (``GROUP_RANK``, ``LOCAL_RANK``); its machine count and
    workers per machine must be the host file's."""
    if group_world != len(hosts):
        raise HostFileError(f"torchrun started {group_world} machine(s) but the host file lists {len(hosts)}", where=where)
    if not 0 <= group_rank < len(hosts):
        raise HostFileError(f"torchrun's node rank {group_rank} is outside 0..{len(hosts) - 1}", where=where)
    host = hosts[group_rank]
    if local_world != len(host.nodes):
        raise HostFileError(
            f"machine {group_rank} ({host.name!r}) runs {local_world} worker(s) but the host file gives it "
            f"{len(host.nodes)} plan node(s): start it with --nproc-per-node={len(host.nodes)}", where=where,
        )
    if not 0 <= local_rank < local_world:
        raise HostFileError(f"local rank {local_rank} is outside 0..{local_world - 1}", where=where)
    return Placement(node=host.nodes[local_rank], host=host.name, gpu=local_rank % host.gpus if host.gpus else None)


def torchrun_placement(hosts: list[Host], where: str, environ: dict[str, str]) -> Placement:
    """``place`` with torchrun's ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``."""
    names = ("GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    missing = [k for k in names if k not in environ]
    if missing:
        raise HostFileError(f"a host file needs torchrun's {', '.join(missing)} in the environment", where=where)
    try:
        values = [int(environ[k]) for k in names]
    except ValueError:
        raise HostFileError(f"torchrun's {', '.join(names)} must be integers", where=where) from None
    return place(hosts, where, *values)
