"""Clusters: nodes, the links between them, their compute speed and memory.

A cluster comes from a preset (a network table of ``resources/networks.json`` and one of its
settings, N nodes placed round-robin over the setting's locations) or from a user file (JSON or
TOML) that gives each node a location, explicit latency/bandwidth matrices, or a measured
``transfer_s`` matrix. Everything here is torch-free.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from skippipe.config_fields import read_config_file as read_json_or_toml
from skippipe.config_fields import read_dataclass, show
from skippipe.costs import forward_seconds, transfer_seconds
from skippipe.errors import ClusterError
from skippipe.limits import MAX_CHARS, MAX_NODES

TABLE_NAMES = ("gcp-2025", "aws-2022")
SETTING_NAMES = ("geo-distributed", "single-cluster", "5-clusters")


@dataclass
class Cluster:
    """N nodes. Exactly one of (latency_ms + bandwidth_GBps) or transfer_s describes the links."""

    name: str
    n: int
    locations: list[str] | None = None
    latency_ms: np.ndarray | None = None
    bandwidth_GBps: np.ndarray | None = None
    transfer_s: np.ndarray | None = None  # measured seconds per microbatch hop, used as is
    compute_speed: np.ndarray = field(default_factory=lambda: np.ones(0))
    forward_s: np.ndarray | None = None  # explicit forward seconds per microbatch per node
    memory: np.ndarray | None = None  # activation slots (microbatches) per node
    stages: list[list[int]] | None = None  # a fixed node -> stage allocation
    t_layer_s: float | None = None  # compute constant of the reference layer (costs.layer_flops), if given

    def __post_init__(self) -> None:
        if self.compute_speed.size == 0:
            self.compute_speed = np.ones(self.n)
        _check_cluster(self)

    def transfer_matrix(self, nbytes: int, hop_overhead_s: float) -> np.ndarray:
        """Seconds per microbatch hop i -> j (0 on the diagonal)."""
        if self.transfer_s is not None:
            t = np.array(self.transfer_s, dtype=float)
            np.fill_diagonal(t, 0.0)
            return t
        assert self.latency_ms is not None and self.bandwidth_GBps is not None
        return transfer_seconds(self.latency_ms, self.bandwidth_GBps, nbytes, hop_overhead_s)

    def forward_vector(self, t_layer_s: float, layers_per_stage: int, samples: int) -> np.ndarray:
        """Forward seconds of one stage for one microbatch, per node."""
        if self.forward_s is not None:
            return np.array(self.forward_s, dtype=float)
        return forward_seconds(t_layer_s, layers_per_stage, samples, self.compute_speed)

    def memory_vector(self, default: int) -> np.ndarray:
        if self.memory is not None:
            return np.array(self.memory, dtype=int)
        return np.full(self.n, int(default), dtype=int)

    def to_dict(self) -> dict[str, Any]:
        """The cluster as a file ``cluster_from_dict`` reads back."""
        out: dict[str, Any] = {"name": self.name, "n": self.n}
        if self.locations is not None:
            out["locations"] = list(self.locations)
        if self.transfer_s is not None:
            out["transfer_s"] = np.asarray(self.transfer_s).tolist()
        else:
            out["latency_ms"] = np.asarray(self.latency_ms).tolist()
            out["bandwidth_GBps"] = np.asarray(self.bandwidth_GBps).tolist()
        if self.forward_s is not None:  # the two exclude each other in a cluster file
            out["forward_s"] = np.asarray(self.forward_s).tolist()
        else:
            out["compute_speed"] = np.asarray(self.compute_speed).tolist()
        if self.memory is not None:
            out["memory"] = np.asarray(self.memory).tolist()
        if self.stages is not None:
            out["stages"] = [list(s) for s in self.stages]
        return out


# ---------------------------------------------------------------------------------- tables


@lru_cache(maxsize=1)
def network_tables() -> dict[str, Any]:
    text = resources.files("skippipe").joinpath("resources/networks.json").read_text()
    return json.loads(text)


def _table(name: str) -> dict[str, Any]:
    tables = network_tables()
    if name not in tables:
        raise ClusterError(f"unknown network table {show(name)} (known: {', '.join(tables)})")
    return tables[name]


def location_matrices(table: str, locations: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Latency (ms) and bandwidth (GiB/s) between nodes placed at ``locations``.

    A pair the table does not list (aws-2022 lacks Ireland-Sofia and Ireland-Amsterdam) is
    estimated as the best one-relay route: summed latency, bottleneck bandwidth.
    """
    tab = _table(table)
    known = list(tab["locations"])
    for loc in locations:
        if loc not in known:
            raise ClusterError(f"unknown location {show(loc)} in table {table!r} (known: {', '.join(known)})")
    k = len(known)
    idx = {name: i for i, name in enumerate(known)}
    lat = np.full((k, k), np.nan)
    bw = np.full((k, k), np.nan)
    for link in tab["links"]:
        a, b = idx[link["a"]], idx[link["b"]]
        lat[a, b] = lat[b, a] = float(link["latency_ms"])
        bw[a, b] = bw[b, a] = float(link["bandwidth_GBps"])
    for a in range(k):
        for b in range(a + 1, k):
            if np.isnan(lat[a, b]):
                relays = [r for r in range(k) if r not in (a, b) and not np.isnan(lat[a, r]) and not np.isnan(lat[r, b])]
                if not relays:
                    raise ClusterError(f"table {table!r} has no link or relay between {known[a]} and {known[b]}")
                r = min(relays, key=lambda r: lat[a, r] + lat[r, b])
                lat[a, b] = lat[b, a] = lat[a, r] + lat[r, b]
                bw[a, b] = bw[b, a] = min(bw[a, r], bw[r, b])
    same = tab["same_location"]
    np.fill_diagonal(lat, float(same["latency_ms"]))
    np.fill_diagonal(bw, float(same["bandwidth_GBps"]))
    node_idx = [idx[loc] for loc in locations]
    return lat[np.ix_(node_idx, node_idx)], bw[np.ix_(node_idx, node_idx)]


def preset_cluster(table: str, setting: str, n: int) -> Cluster:
    """N nodes placed round-robin over the locations of one of the table's settings."""
    tab = _table(table)
    if setting not in tab["settings"]:
        raise ClusterError(f"unknown setting {show(setting)} for table {table!r} (known: {', '.join(tab['settings'])})")
    if not 2 <= n <= MAX_NODES:
        raise ClusterError(f"a cluster needs 2 to {MAX_NODES} nodes, got {n}")
    locs = list(tab["settings"][setting])
    locations = [locs[i % len(locs)] for i in range(n)]
    lat, bw = location_matrices(table, locations)
    return Cluster(
        name=f"{table}/{setting}/{n}",
        n=n,
        locations=locations,
        latency_ms=lat,
        bandwidth_GBps=bw,
        t_layer_s=float(tab["compute_s_per_sample_per_layer"]),
    )


def parse_preset(spec: str) -> Cluster:
    """``TABLE/SETTING/N``, e.g. ``gcp-2025/geo-distributed/20``."""
    parts = spec.split("/")
    if len(parts) != 3:
        raise ClusterError(f"preset must look like TABLE/SETTING/N (e.g. gcp-2025/geo-distributed/20), got {show(spec)}")
    table, setting, n_text = parts
    if n_text.isdigit() and len(n_text) > len(str(MAX_NODES)):  # int() of 5,000 digits would fail with a ValueError
        shown = n_text if len(n_text) <= 20 else f"a number of {len(n_text)} digits"
        raise ClusterError(f"a cluster needs 2 to {MAX_NODES} nodes, got {shown}")
    try:
        n = int(n_text)
    except ValueError:
        raise ClusterError(f"preset node count must be an integer, got {show(n_text)}") from None
    return preset_cluster(table, setting, n)


# ---------------------------------------------------------------------------------- files


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON or TOML file (by extension; JSON otherwise) into a dict, with one-line errors."""
    return read_json_or_toml(path, default_format="json", error=ClusterError, what="cluster file")


PER_NODE = {"max_len": MAX_NODES}  # lists and matrices have one entry per node
NON_NEGATIVE = {"min": 0, **PER_NODE}
ABOVE_ZERO = {"gt": 0, **PER_NODE}


@dataclass(frozen=True)
class ClusterFile:
    """The keys of a cluster file, read by ``read_dataclass``; ``cluster_from_dict`` checks how
    they fit together (shapes, one link description) and builds the ``Cluster``."""

    name: str | None = None
    description: str | None = None
    n: int | None = field(default=None, metadata={"min": 2, "max": MAX_NODES})  # optional: must match the matrices
    table: str = "gcp-2025"  # network table for locations without matrices
    locations: list[str] | None = field(default=None, metadata=PER_NODE)
    latency_ms: list[list[float]] | None = field(default=None, metadata=NON_NEGATIVE)
    bandwidth_GBps: list[list[float]] | None = field(default=None, metadata=NON_NEGATIVE)
    transfer_s: list[list[float]] | None = field(default=None, metadata=NON_NEGATIVE)
    compute_speed: float | list[float] | None = field(default=None, metadata=ABOVE_ZERO)  # one for all, or per node
    forward_s: float | list[float] | None = field(default=None, metadata=ABOVE_ZERO)
    memory: int | list[int] | None = field(default=None, metadata={"min": 1, **PER_NODE})
    stages: list[list[int]] | None = field(default=None, metadata={"min": 0, "max": MAX_NODES - 1, "min_len": 1, **PER_NODE})
    t_layer_s: float | None = field(default=None, metadata=ABOVE_ZERO)
    profile: dict[str, Any] | None = None  # what `skippipe profile` measured (kept for reference, not read)


def _matrix(value: list[list[float]], key: str, n: int | None, where: str) -> np.ndarray:
    if any(len(row) != len(value) for row in value):
        lengths = sorted({len(row) for row in value})
        raise ClusterError(
            f"{key} must be a square N x N matrix, got {len(value)} rows of length {lengths}", where=where, key=key
        )
    m = np.array(value, dtype=float).reshape(len(value), len(value))
    if n is not None and m.shape[0] != n:
        raise ClusterError(f"{key} is {m.shape[0]} x {m.shape[0]} but the cluster has {n} nodes", where=where, key=key)
    return m


def _vector(value: float | list[float], key: str, n: int, where: str) -> np.ndarray:
    values = value if isinstance(value, list) else [value] * n
    if len(values) != n:
        raise ClusterError(f"{key} must have one entry per node ({n}), got {len(values)}", where=where, key=key)
    return np.array(values, dtype=float)


def cluster_from_dict(data: dict[str, Any], where: str = "cluster") -> Cluster:
    f = read_dataclass(ClusterFile, data, where, error=ClusterError)
    if f.transfer_s is not None and (f.latency_ms is not None or f.bandwidth_GBps is not None):
        raise ClusterError("give either transfer_s or latency_ms/bandwidth_GBps, not both", where=where, key="transfer_s")
    if f.locations is None and f.latency_ms is None and f.transfer_s is None:
        raise ClusterError("needs one of locations, latency_ms + bandwidth_GBps, or transfer_s", where=where)
    if f.compute_speed is not None and f.forward_s is not None:
        raise ClusterError("give compute_speed or forward_s, not both", where=where, key="forward_s")
    latency = bandwidth = transfer = None
    t_layer = f.t_layer_s
    if f.transfer_s is not None:
        transfer = _matrix(f.transfer_s, "transfer_s", None, where)
        n = transfer.shape[0]
    elif f.latency_ms is not None:
        if f.bandwidth_GBps is None:
            raise ClusterError("latency_ms needs a bandwidth_GBps matrix beside it", where=where, key="latency_ms")
        latency = _matrix(f.latency_ms, "latency_ms", None, where)
        n = latency.shape[0]
        bandwidth = _matrix(f.bandwidth_GBps, "bandwidth_GBps", n, where)
        if np.any(bandwidth[~np.eye(n, dtype=bool)] <= 0):
            raise ClusterError("bandwidth_GBps must be > 0 between distinct nodes", where=where, key="bandwidth_GBps")
    else:
        assert f.locations is not None
        if f.table not in network_tables():
            known = ", ".join(network_tables())
            raise ClusterError(f"unknown network table {show(f.table)} (known: {known})", where=where, key="table")
        places = list(_table(f.table)["locations"])
        for i, loc in enumerate(f.locations):
            if loc not in places:
                raise ClusterError(
                    f"locations[{i}]: unknown location {show(loc)} in table {f.table!r} (known: {', '.join(places)})",
                    where=where, key="locations",
                )
        latency, bandwidth = location_matrices(f.table, f.locations)
        n = len(f.locations)
        if t_layer is None:
            t_layer = float(_table(f.table)["compute_s_per_sample_per_layer"])
    if f.locations is not None and len(f.locations) != n:
        raise ClusterError(f"{len(f.locations)} locations for {n} nodes", where=where, key="locations")
    if n < 2:
        raise ClusterError(f"a cluster needs at least 2 nodes, got {n}", where=where)
    if f.n is not None and f.n != n:
        raise ClusterError(f"n = {f.n} but the cluster has {n} nodes", where=where, key="n")
    memory = None if f.memory is None else _vector(f.memory, "memory", n, where).astype(int)
    return Cluster(
        name=where if f.name is None else f.name, n=n, locations=f.locations, latency_ms=latency,
        bandwidth_GBps=bandwidth, transfer_s=transfer,
        compute_speed=np.ones(n) if f.compute_speed is None else _vector(f.compute_speed, "compute_speed", n, where),
        forward_s=None if f.forward_s is None else _vector(f.forward_s, "forward_s", n, where),
        memory=memory, stages=f.stages, t_layer_s=t_layer,
    )


def load_cluster(spec: str) -> Cluster:
    """A preset ``TABLE/SETTING/N``, a shipped example name, or a path to a JSON/TOML file."""
    if len(spec) > MAX_CHARS:
        raise ClusterError(f"a cluster name or path of {len(spec)} characters, more than the limit of {MAX_CHARS}")
    p = Path(spec)
    if p.suffix.lower() in (".json", ".toml") or _exists(p):
        return cluster_from_dict(read_config_file(p), where=str(p))
    examples = example_cluster_names()
    if spec in examples:
        text = resources.files("skippipe").joinpath(f"resources/examples/{spec}.json").read_text()
        return cluster_from_dict(json.loads(text), where=spec)
    if spec.count("/") == 2:
        return parse_preset(spec)
    raise ClusterError(
        f"unknown cluster {show(spec)}: give TABLE/SETTING/N (tables {', '.join(TABLE_NAMES)}; "
        f"settings {', '.join(SETTING_NAMES)}), a shipped example ({', '.join(examples)}), or a .json/.toml file"
    )


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except OSError:  # e.g. a name too long for the file system: not a file, maybe a preset
        return False


def example_cluster_names() -> list[str]:
    folder = resources.files("skippipe").joinpath("resources/examples")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


# ---------------------------------------------------------------------------------- checks


def _check_cluster(c: Cluster) -> None:
    if not 2 <= c.n <= MAX_NODES:
        raise ClusterError(f"a cluster needs 2 to {MAX_NODES} nodes, got {c.n}", where=c.name, key="n")
    if c.t_layer_s is not None and not 0 < c.t_layer_s < math.inf:
        raise ClusterError(f"t_layer_s must be > 0 and finite, got {c.t_layer_s}", where=c.name, key="t_layer_s")
    if c.stages is not None:
        seen: set[int] = set()
        for s in c.stages:
            for node in s:
                if not 0 <= node < c.n:
                    raise ClusterError(f"stage node {node} is not a node id (0..{c.n - 1})", where=c.name, key="stages")
                if node in seen:
                    raise ClusterError(f"node {node} appears in more than one stage", where=c.name, key="stages")
                seen.add(node)
    if c.memory is not None and np.any(np.asarray(c.memory) < 1):
        raise ClusterError("memory must be at least 1 microbatch on every node", where=c.name, key="memory")
