"""Synthetic clusters for benchmarks and tests (torch-free, deterministic for a seed).

- ``random_global_cluster``: nodes at random sites on the globe (several nodes may share a
  site). Latency grows with the great-circle distance (fibre at about 2/3 of the speed of light
  on a route 1.5 times longer than the great circle, plus a few milliseconds), bandwidth falls
  with it (from about 0.6 GiB/s between neighbours to a few MiB/s across the globe, with
  log-normal noise), and a fraction of the links between sites is *broken*: usable only at a
  trickle (1e-4 GiB/s, hundreds of seconds per hop), like the 132 s NL-London link of the
  gcp-2025 table. Optional spread of compute speed and memory per node.
- ``single_site_cluster``: every link the same (one data centre).
- ``one_per_location``: one node at each location of a network table.
- ``suite``: the scheduler suite (``SuiteCase``: a cluster, S and L), every kind above plus the
  gcp/aws presets in their three settings, 12 to 1,000 nodes, S = 4..9.

Every function returns a ``skippipe.cluster.Cluster`` with explicit latency and bandwidth
matrices, which ``Cluster.to_dict`` writes as a cluster file that ``skippipe plan`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from skippipe.cluster import SETTING_NAMES, TABLE_NAMES, Cluster, location_matrices, network_tables, parse_preset
from skippipe.workload import Workload

EARTH_RADIUS_KM = 6371.0
SAME_SITE_LATENCY_MS = 1.0
SAME_SITE_BANDWIDTH_GBPS = 2.0
BROKEN_BANDWIDTH_GBPS = 1e-4


def great_circle_km(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Pairwise great-circle distances (km) between points given in degrees."""
    phi = np.radians(lat)[:, None]
    lam = np.radians(lon)[:, None]
    a = np.sin((phi - phi.T) / 2) ** 2 + np.cos(phi) * np.cos(phi.T) * np.sin((lam - lam.T) / 2) ** 2
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))


def random_global_cluster(
    n: int,
    seed: int = 0,
    sites: int | None = None,
    speed: tuple[float, float] | None = None,
    memory: tuple[int, int] | None = None,
    broken: float = 0.0,
    name: str | None = None,
) -> Cluster:
    """``n`` nodes at ``sites`` random places on the globe (default: one site per node).

    ``speed=(lo, hi)``: compute speed per node drawn uniformly from [lo, hi]; ``memory=(lo,
    hi)``: activation slots per node drawn uniformly from lo..hi; ``broken``: the fraction of
    links between distinct sites that only trickle (``BROKEN_BANDWIDTH_GBPS``).
    """
    rng = np.random.default_rng(seed)
    k = n if sites is None else max(1, min(int(sites), n))
    lat = np.degrees(np.arcsin(rng.uniform(-1.0, 1.0, size=k)))  # uniform on the sphere
    lon = rng.uniform(-180.0, 180.0, size=k)
    site_of = np.arange(n) % k if k == n else np.concatenate([np.arange(k), rng.integers(0, k, size=n - k)])
    dist = great_circle_km(lat, lon)
    lat_ms = 3.0 + dist * 1.5 / 200.0  # 200 km per ms in fibre
    noise = np.exp(rng.normal(0.0, 0.3, size=(k, k)))
    noise = np.sqrt(noise * noise.T)
    bw = 0.6 * np.exp(-dist / 4000.0) * noise + 0.002
    if broken > 0 and k > 1:
        iu = np.triu_indices(k, 1)
        cut = rng.random(len(iu[0])) < broken
        bw[iu[0][cut], iu[1][cut]] = BROKEN_BANDWIDTH_GBPS
        bw[iu[1][cut], iu[0][cut]] = BROKEN_BANDWIDTH_GBPS
    np.fill_diagonal(lat_ms, SAME_SITE_LATENCY_MS)
    np.fill_diagonal(bw, SAME_SITE_BANDWIDTH_GBPS)
    latency = lat_ms[np.ix_(site_of, site_of)]
    bandwidth = bw[np.ix_(site_of, site_of)]
    compute = np.ones(n) if speed is None else np.round(rng.uniform(speed[0], speed[1], size=n), 3)
    mem = None if memory is None else rng.integers(memory[0], memory[1] + 1, size=n)
    return Cluster(
        name=name or f"random-global-{n}-s{seed}", n=n, latency_ms=latency, bandwidth_GBps=bandwidth,
        compute_speed=compute, memory=mem,
    )


def single_site_cluster(
    n: int, seed: int = 0, speed: tuple[float, float] | None = None, memory: tuple[int, int] | None = None,
    name: str | None = None,
) -> Cluster:
    """``n`` nodes in one data centre: every link 1 ms and 2 GiB/s."""
    rng = np.random.default_rng(seed)
    latency = np.full((n, n), SAME_SITE_LATENCY_MS)
    bandwidth = np.full((n, n), SAME_SITE_BANDWIDTH_GBPS)
    compute = np.ones(n) if speed is None else np.round(rng.uniform(speed[0], speed[1], size=n), 3)
    mem = None if memory is None else rng.integers(memory[0], memory[1] + 1, size=n)
    return Cluster(name=name or f"single-site-{n}", n=n, latency_ms=latency, bandwidth_GBps=bandwidth,
                   compute_speed=compute, memory=mem)


def one_per_location(table: str, name: str | None = None) -> Cluster:
    """One node at every location of a network table (e.g. 12 nodes for gcp-2025)."""
    locations = list(network_tables()[table]["locations"])
    latency, bandwidth = location_matrices(table, locations)
    return Cluster(
        name=name or f"{table}/one-per-location", n=len(locations), locations=locations, latency_ms=latency,
        bandwidth_GBps=bandwidth, t_layer_s=float(network_tables()[table]["compute_s_per_sample_per_layer"]),
    )


@dataclass(frozen=True)
class SuiteCase:
    kind: str
    cluster: Cluster
    num_stages: int
    path_length: int

    def workload(self) -> Workload:
        """The case's workload: its stages and path length, the other fields at their defaults."""
        return Workload(num_stages=self.num_stages, path_length=self.path_length)


def gcp_regions_cluster(n: int) -> Cluster:
    """``n`` nodes round robin over the 12 GCP regions of gcp-2025."""
    locations = list(network_tables()["gcp-2025"]["locations"])
    placed = [locations[i % len(locations)] for i in range(n)]
    latency, bandwidth = location_matrices("gcp-2025", placed)
    return Cluster(name=f"gcp-2025/12-regions/{n}", n=n, locations=placed, latency_ms=latency,
                   bandwidth_GBps=bandwidth, t_layer_s=float(network_tables()["gcp-2025"]["compute_s_per_sample_per_layer"]))


def suite(seed: int = 0, largest: int = 1000) -> list[SuiteCase]:
    """The scheduler suite: every cluster kind of issue 10, deterministic for ``seed``.

    Clusters above ``largest`` nodes are left out (a quick run passes e.g. 100).
    """
    uneven = {"speed": (0.5, 2.0), "memory": (1, 4)}
    cases = [
        SuiteCase("gcp one per region", one_per_location("gcp-2025"), 5, 3),
        SuiteCase("single site", single_site_cluster(18, seed), 4, 3),
        SuiteCase("single site, uneven", single_site_cluster(24, seed, **uneven), 6, 4),
        SuiteCase("global random", random_global_cluster(16, seed, broken=0.1), 4, 3),
        SuiteCase("global uneven", random_global_cluster(24, seed + 1, speed=(0.5, 1.7)), 7, 4),
        SuiteCase("global uneven+mem", random_global_cluster(30, seed + 2, broken=0.1, **uneven), 8, 5),
        SuiteCase("global, 6 sites", random_global_cluster(40, seed + 3, sites=6, broken=0.1, **uneven), 9, 5),
        SuiteCase("6 sites, mem 1-4 only", random_global_cluster(40, seed + 6, sites=6, broken=0.1, memory=(1, 4)), 9, 5),
    ]
    for table in TABLE_NAMES:
        for setting in SETTING_NAMES:
            cases.append(SuiteCase(f"{table} {setting}", parse_preset(f"{table}/{setting}/20"), 6, 4))
    cases.append(SuiteCase("gcp 12 regions", gcp_regions_cluster(100), 9, 5))
    cases.append(SuiteCase("global uneven", random_global_cluster(100, seed + 4, sites=30, broken=0.05, **uneven), 7, 4))
    cases.append(SuiteCase("gcp 12 regions", gcp_regions_cluster(1000), 9, 5))
    cases.append(SuiteCase("global uneven", random_global_cluster(1000, seed + 5, sites=60, broken=0.05, **uneven), 9, 5))
    return [c for c in cases if c.cluster.n <= largest]
