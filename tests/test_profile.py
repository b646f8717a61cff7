"""``skippipe profile``: link fits, pair rounds, the cluster file, and a real emulated profile
whose measured links come back close to the emulated cluster's."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.cli import build_parser, main
from skippipe.cluster import cluster_from_dict, load_cluster
from skippipe.commands.profile import spec_from_args
from skippipe.planner.problem import build_problem
from skippipe.runtime.profile.emulated import EmulatedLinks
from skippipe.runtime.profile.fit import (
    GIB,
    Measured,
    cluster_document,
    fit_link,
    link_errors,
    link_matrices,
    links_of,
    memory_slots,
)
from skippipe.runtime.profile.measure import pair_rounds
from skippipe.runtime.profile.spec import ProfileSpec
from skippipe.workload import Workload


@given(st.floats(1e-4, 0.5), st.floats(1e-3, 10.0))
def test_fit_link_recovers_latency_and_bandwidth(latency, bandwidth):
    sizes = np.array([1024, 65536, 1 << 20, 4 << 20], dtype=float)
    lat, bw = fit_link(sizes, latency + sizes / (bandwidth * GIB))
    assert lat == pytest.approx(latency, rel=1e-6, abs=1e-9)
    assert bw == pytest.approx(bandwidth, rel=1e-6)


def test_fit_link_never_goes_negative():
    lat, bw = fit_link(np.array([1.0, 2.0, 3.0]), np.array([0.3, 0.2, 0.1]))  # noise: time falls with size
    assert lat >= 0 and bw > 0
    with pytest.raises(ValueError):
        fit_link(np.array([5.0, 5.0]), np.array([1.0, 1.0]))


@given(st.integers(2, 25))
def test_pair_rounds_cover_every_pair_once_in_disjoint_rounds(n):
    rounds = pair_rounds(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == [(i, j) for i in range(n) for j in range(i + 1, n)]
    for r in rounds:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)


def _measured(n: int, lat_ms: np.ndarray, bw: np.ndarray, sizes: list[int], scale: float = 1.0) -> Measured:
    one_way = np.zeros((n, n, len(sizes)))
    for i in range(n):
        for j in range(i + 1, n):
            one_way[i, j] = (lat_ms[i, j] / 1000 + np.array(sizes) / (bw[i, j] * GIB)) * scale
    return Measured(sizes, one_way, np.full(n, 0.02 * scale), np.full(n, 0.03 * scale), np.array([1e9, 1e9, 5e6]),
                    np.full(n, 1e6), np.full(n, 2e6))


@pytest.mark.parametrize("links", ["transfer", "latency"])
def test_cluster_document_is_a_cluster_plan_reads(links):
    c = load_cluster("gcp-2025/geo-distributed/3")
    sizes = [1024, 1 << 20, 4 << 20]
    m = _measured(3, c.latency_ms, c.bandwidth_GBps, sizes, scale=0.5)
    doc = cluster_document(m, name="p", d_model=128, ctx=128, samples=8, layers=3, time_scale=0.5, links=links,
                           max_slots=16, info={"nodes": 3})
    cluster = cluster_from_dict(json.loads(json.dumps(doc)))
    assert np.allclose(cluster.forward_s, 0.02)  # cluster seconds: measured / time scale
    assert cluster.memory.tolist() == [16, 16, 3]  # capped; (5e6 - 2e6) // 1e6 on the small node
    lat, bw = link_matrices(m.one_way_s, sizes, 0.5)
    off = ~np.eye(3, dtype=bool)
    assert np.allclose(lat[off], c.latency_ms[off], rtol=1e-4) and np.allclose(bw[off], c.bandwidth_GBps[off], rtol=1e-4)
    nbytes = 4 * 128 * 128 * 8
    p = build_problem(cluster, Workload(num_stages=2, path_length=2, n_layers=4, d_model=128, ctx=128))
    expected = c.latency_ms / 1000 + nbytes / (c.bandwidth_GBps * GIB) + (0 if links == "transfer" else 0.35)
    assert np.allclose(p.transfer_s[off], expected[off], rtol=1e-4)
    errors = link_errors(links_of(doc), c.latency_ms, c.bandwidth_GBps, nbytes).summary()
    assert errors["transfer_max"] < 1e-4 and errors["latency_max"] < 1e-4


def test_memory_slots_floor_at_one():
    usable, act, state = np.array([1e6, 1e9]), np.array([1e6, 1e6]), np.array([5e6, 0])
    m = Measured([1, 2], np.zeros((2, 2, 2)), np.ones(2), np.ones(2), usable, act, state)
    assert memory_slots(m, 64).tolist() == [1, 64]


def test_emulated_links_delay_grows_with_size():
    links = EmulatedLinks.load("gcp-2025/geo-distributed/3", 3, 0.5)
    assert links.delay_s(0, 0, 10**6) == 0
    small, big = links.delay_s(0, 1, 1024), links.delay_s(0, 1, 1 << 20)
    assert small == pytest.approx((41 / 1000 + 1024 / (0.02 * GIB)) * 0.5, rel=0.05) and big > small


@settings(max_examples=20)
@given(st.lists(st.integers(1, 10**8), min_size=2, max_size=5, unique=True), st.sampled_from(["transfer", "latency"]),
       st.one_of(st.none(), st.just("gcp-2025/geo-distributed/4")), st.floats(0.01, 4.0))
def test_spec_travels_to_workers_as_flags(sizes, links, emulate, scale):
    spec = ProfileSpec(out="c.json", sizes=tuple(sizes), links=links, emulate=emulate, time_scale=scale, reps=2)
    argv = ["profile", *spec.to_argv()]
    assert spec_from_args(build_parser(argv).parse_args(argv)) == spec


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "1"], "must be from 2"),
    (["--sizes", "a,b"], "comma-separated"),
    (["--sizes", "10,10"], "two different"),
    (["--emulate", "gcp20-shipped"], "transfer_s only"),
    (["--model", "gpt-9"], "unknown model preset"),
    (["--stages", "99"], "only 12 layers"),
])
def test_bad_input_is_one_line_before_any_worker(tmp_path, capsys, argv, message):
    assert main(["profile", "--out", str(tmp_path / "c.json"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "c.json").exists()


def test_emulated_profile_measures_the_emulated_links(tmp_path, capsys):
    """Three local workers, links of three gcp-2025 regions emulated: the fitted links come back
    close to the emulated ones (emulated times doubled, so that a busy machine's millisecond of
    noise stays small against the 4 ms link), and ``skippipe plan`` plans on the file."""
    out = tmp_path / "cluster.json"
    argv = ["profile", "--nodes", "3", "--emulate", "gcp-2025/geo-distributed/3", "--sizes", "1024,262144,1048576,2097152",
            "--reps", "3", "--compute-reps", "2", "--time-scale", "2", "--out", str(out), "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    errors = summary["errors"]
    assert errors["transfer_max"] < 0.25 and errors["latency_max"] < 0.25 and errors["bandwidth_max"] < 0.35
    assert errors["transfer_median"] < 0.10
    assert summary["time_scale"] == 2  # times are cluster seconds: measured / 2
    doc = json.loads(out.read_text())
    assert len(doc["transfer_s"]) == 3 and all(f > 0 for f in doc["forward_s"]) and all(m >= 1 for m in doc["memory"])
    assert main(["plan", "--cluster", str(out), "--stages", "2", "--path-length", "2", "--layers", "4", "--d-model", "128",
                 "--ctx", "128", "--out", str(tmp_path / "plan.json")]) == 0


def test_a_failing_worker_is_named(tmp_path, capsys):
    """Workers that cannot start (no CUDA here, or a CUDA device index that is not there) stop the
    profile with one line naming the worker, exit 3, and no file."""
    import torch

    device = "cuda:99" if torch.cuda.is_available() else "cuda"
    assert main(["profile", "--nodes", "2", "--device", device, "--out", str(tmp_path / "c.json")]) == 3
    err = capsys.readouterr().err.strip()
    assert "profile worker" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "c.json").exists()
