"""Synthetic clusters (``skippipe.cluster_gen``): deterministic, and shaped as documented."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.cluster import cluster_from_dict
from skippipe.cluster_gen import (
    BROKEN_BANDWIDTH_GBPS,
    great_circle_km,
    one_per_location,
    random_global_cluster,
    single_site_cluster,
    suite,
)


def test_same_seed_same_cluster_other_seed_other_cluster():
    a = random_global_cluster(15, seed=3, speed=(0.5, 2.0), memory=(1, 4), broken=0.2)
    b = random_global_cluster(15, seed=3, speed=(0.5, 2.0), memory=(1, 4), broken=0.2)
    c = random_global_cluster(15, seed=4, speed=(0.5, 2.0), memory=(1, 4), broken=0.2)
    assert np.array_equal(a.latency_ms, b.latency_ms) and np.array_equal(a.bandwidth_GBps, b.bandwidth_GBps)
    assert np.array_equal(a.compute_speed, b.compute_speed) and np.array_equal(a.memory, b.memory)
    assert not np.array_equal(a.latency_ms, c.latency_ms)


def test_great_circle_known_distance():
    # London (51.5, -0.13) to New York (40.7, -74.0): about 5,570 km
    d = great_circle_km(np.array([51.5, 40.7]), np.array([-0.13, -74.0]))
    assert abs(d[0, 1] - 5570) < 30 and d[0, 0] == 0


@settings(max_examples=20, deadline=None)
@given(n=st.integers(4, 40), seed=st.integers(0, 10_000), broken=st.sampled_from([0.0, 0.2]))
def test_random_global_shape(n, seed, broken):
    c = random_global_cluster(n, seed=seed, speed=(0.5, 2.0), memory=(1, 4), broken=broken)
    lat, bw = c.latency_ms, c.bandwidth_GBps
    assert lat.shape == bw.shape == (n, n)
    assert np.allclose(lat, lat.T) and np.allclose(bw, bw.T)
    assert (lat > 0).all() and (bw > 0).all()
    assert ((c.compute_speed >= 0.5) & (c.compute_speed <= 2.0)).all()
    assert ((c.memory >= 1) & (c.memory <= 4)).all()
    if broken == 0.0:
        assert (bw > BROKEN_BANDWIDTH_GBPS).all()
    # a cluster file round trip keeps it
    again = cluster_from_dict(c.to_dict())
    assert np.allclose(again.latency_ms, lat) and np.allclose(again.bandwidth_GBps, bw)


def test_latency_grows_and_bandwidth_falls_with_distance():
    c = random_global_cluster(40, seed=1)
    iu = np.triu_indices(40, 1)
    lat, bw = c.latency_ms[iu], c.bandwidth_GBps[iu]
    assert np.corrcoef(lat, np.log(bw))[0, 1] < -0.8


def test_broken_links_trickle():
    c = random_global_cluster(30, seed=2, broken=0.3)
    iu = np.triu_indices(30, 1)
    share = float(np.mean(c.bandwidth_GBps[iu] == BROKEN_BANDWIDTH_GBPS))
    assert 0.15 < share < 0.45


def test_single_site_and_one_per_location():
    s = single_site_cluster(9, speed=(0.5, 2.0))
    assert np.ptp(s.latency_ms) == 0 and np.ptp(s.bandwidth_GBps) == 0 and np.ptp(s.compute_speed) > 0
    g = one_per_location("gcp-2025")
    assert g.n == 12 and len(set(g.locations)) == 12


def test_suite_covers_the_kinds():
    cases = suite()
    assert [c.cluster.n for c in suite()] == [c.cluster.n for c in cases]  # deterministic
    sizes = [c.cluster.n for c in cases]
    assert min(sizes) == 12 and max(sizes) == 1000
    assert {c.num_stages for c in cases} == set(range(4, 10))
    assert any(c.num_stages - 1 > 4 for c in cases)  # the jump rule binds (0 -> S-1 forbidden)
    assert sum("single-cluster" in c.kind or "5-clusters" in c.kind or "geo-distributed" in c.kind for c in cases) == 6
    assert all(c.cluster.n <= 100 for c in suite(largest=100))
