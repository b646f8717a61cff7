"""Size-dependent WAN emulation for the profile: a message of ``b`` bytes from i to j is held
``(latency_ms[i][j] / 1000 + b / (bandwidth_GBps[i][j] * 2**30)) * time_scale`` seconds before it
is sent, so that a ping-pong on one machine sees the emulated cluster's links. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from skippipe.cluster import Cluster, load_cluster
from skippipe.errors import ClusterError


@dataclass(frozen=True)
class EmulatedLinks:
    latency_ms: np.ndarray
    bandwidth_GBps: np.ndarray
    time_scale: float

    @classmethod
    def of_cluster(cls, cluster: Cluster, nodes: int, time_scale: float) -> EmulatedLinks:
        if cluster.latency_ms is None or cluster.bandwidth_GBps is None:
            raise ClusterError(f"cluster {cluster.name!r} gives transfer_s only; emulating links needs latency and bandwidth")
        if cluster.n < nodes:
            raise ClusterError(f"cluster {cluster.name!r} has {cluster.n} nodes; the profile runs {nodes} workers")
        lat = np.asarray(cluster.latency_ms, dtype=float)[:nodes, :nodes]
        bw = np.asarray(cluster.bandwidth_GBps, dtype=float)[:nodes, :nodes]
        return cls(latency_ms=lat, bandwidth_GBps=bw, time_scale=float(time_scale))

    @classmethod
    def load(cls, spec: str, nodes: int, time_scale: float) -> EmulatedLinks:
        return cls.of_cluster(load_cluster(spec), nodes, time_scale)

    def delay_s(self, src: int, dst: int, nbytes: int) -> float:
        """Real seconds a message of ``nbytes`` from ``src`` to ``dst`` is held."""
        if src == dst:
            return 0.0
        seconds = self.latency_ms[src, dst] / 1000.0 + nbytes / (self.bandwidth_GBps[src, dst] * 1024.0**3)
        return float(seconds) * self.time_scale
