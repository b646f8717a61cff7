"""Large clusters planned in parts (``planner.routing.decompose``): groups by the network, stage
sizes split over them, group plans merged into one valid plan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_strategies import islands_the_caps_cannot_carry
from skippipe.cluster import Cluster
from skippipe.cluster_gen import SAME_SITE_BANDWIDTH_GBPS, SAME_SITE_LATENCY_MS
from skippipe.planfile import check_plan
from skippipe.planner import methods
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import decompose as D
from skippipe.planner.routing.schedule import plan_skippipe
from skippipe.planner.routing.slow_links import SLOW_GAP
from skippipe.sim import simulate
from skippipe.workload import Workload


def _sites_cluster(sizes: list[int], speed: np.ndarray | None = None) -> tuple[Cluster, np.ndarray]:
    """Nodes in sites of ``sizes`` (node ids site by site, then shuffled): 1 ms / 2 GB/s inside
    a site, 40-120 ms / 0.1 GB/s between sites."""
    site_of = np.concatenate([np.full(k, i) for i, k in enumerate(sizes)])
    site_of = np.random.default_rng(0).permutation(site_of)
    k = len(sizes)
    between = 40.0 + 80.0 * np.abs(np.subtract.outer(np.arange(k), np.arange(k))) / max(1, k - 1)
    lat = np.where(np.equal.outer(site_of, site_of), SAME_SITE_LATENCY_MS, between[np.ix_(site_of, site_of)])
    bw = np.where(np.equal.outer(site_of, site_of), SAME_SITE_BANDWIDTH_GBPS, 0.1)
    n = len(site_of)
    return Cluster(name=f"sites-{sizes}", n=n, latency_ms=lat, bandwidth_GBps=bw,
                   compute_speed=np.ones(n) if speed is None else speed), site_of


def test_locality_groups_are_the_sites_and_tight():
    cluster, site_of = _sites_cluster([60, 70, 80])
    p = build_problem(cluster, Workload(num_stages=6, path_length=4))
    groups = D.locality_groups(p.transfer_s, 50)
    assert sorted(sorted(g) for g in groups) == sorted(sorted(np.flatnonzero(site_of == s).tolist()) for s in range(3))
    assert D.tight(p.transfer_s, groups)
    # with groups bigger than a site, two sites meet in one group: not one site any more
    merged = D.locality_groups(p.transfer_s, 100)
    assert len(merged) < 3 and sum(len(g) for g in merged) == 210
    assert not D.tight(p.transfer_s, merged)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(10, 40), min_size=2, max_size=6), num_stages=st.integers(3, 8),
       path_length=st.integers(2, 5), data=st.data())
def test_apportioned_sizes_add_up_both_ways(sizes, num_stages, path_length, data):
    path_length = min(path_length, num_stages)
    n = sum(sizes)
    total = Workload(num_stages=num_stages, path_length=path_length, max_jump=num_stages).sizes_for(n)
    speed = np.array(data.draw(st.lists(st.floats(0.5, 2.0), min_size=n, max_size=n)))
    ids = np.arange(n)
    groups = [ids[sum(sizes[:i]):sum(sizes[:i + 1])].tolist() for i in range(len(sizes))]
    rows = D.apportion(total, groups, speed)
    if rows is None:  # only when some group cannot hold a node of every stage
        assert total[0] < len(groups) or min(sizes) < num_stages or total[0] > sum(k - (num_stages - 1) for k in sizes) \
            or any(total[s] < len(groups) for s in range(1, num_stages))
        return
    assert [sum(r) for r in rows] == sizes
    assert [sum(col) for col in zip(*rows)] == total
    assert all(min(r) >= 1 for r in rows)
    # data nodes follow the groups' compute speed (largest remainder, one each at least), unless
    # a group needs the rest of its nodes for the other stages
    share = np.array([speed[g].sum() for g in groups])
    ideal = 1 + (total[0] - len(groups)) * share / share.sum()
    room = [k - (num_stages - 1) for k in sizes]
    if all(x < r for x, r in zip(ideal, room)):
        assert all(abs(r[0] - x) < 1.0 for r, x in zip(rows, ideal))
    assert all(r[0] <= k for r, k in zip(rows, room))


@pytest.fixture
def small_thresholds(monkeypatch):
    monkeypatch.setattr(D, "DECOMPOSE_NODES", 40)
    monkeypatch.setattr(D, "GROUP_NODES", 16)
    monkeypatch.setattr(D, "GROUP_BUDGET", 60)


def test_a_cluster_of_sites_is_planned_site_by_site_into_one_valid_plan(small_thresholds):
    cluster, site_of = _sites_cluster([20, 24, 22])
    p = build_problem(cluster, Workload(num_stages=4, path_length=3))
    # each group planned as method skippipe plans the groups of a cluster this large (above
    # DECOMPOSE_NODES): GROUP_BUDGET simulations and the quicker start. (The default search on
    # each group plans a quicker split since the joint allocation takes groups of 20 and 22
    # nodes with S = 4, L = 3: 68.80 s against 72.89 s, which method skippipe does not build.)
    plan = D.decomposed_plan(p, 0, lambda subs, k: [plan_skippipe(sub, seed=0, budget=D.GROUP_BUDGET, thorough=False)
                                                    for sub in subs])
    check_plan(plan)
    assert plan.meta["candidate"] == "groups of sites" and sorted(plan.meta["groups"]) == [20, 22, 24]
    assert [len(s) for s in plan.stages] == p.stage_sizes  # as many data nodes as the workload says
    assert len(plan.microbatches) == p.stage_sizes[0] * p.workload.microbatches_per_data_node
    assert sorted(mb.id for mb in plan.microbatches) == list(range(len(plan.microbatches)))
    for mb in plan.microbatches:  # every round trip stays in its data node's site
        assert {int(site_of[x]) for x in mb.path} == {int(site_of[mb.data_node])}
    # method skippipe takes it unless the no-tc2 plan or a fallback (naive, random) is quicker
    chosen = methods.make_plan("skippipe", p, seed=0)
    split = simulate(plan, record=False).makespan_s
    others = [methods.make_plan(m, p, seed=0).predicted_makespan_s for m in ("skippipe-no-tc2", "naive")]
    assert chosen.predicted_makespan_s <= min(split, *others) + 1e-9


def test_the_merged_plan_is_as_slow_as_its_slowest_group(small_thresholds):
    cluster, _ = _sites_cluster([20, 24])
    p = build_problem(cluster, Workload(num_stages=4, path_length=3))
    got = []
    plan = D.decomposed_plan(p, 0, lambda subs, k: got.extend(methods.make_plan("skippipe", sub, seed=0) for sub in subs) or got)
    assert plan is not None and len(got) == 2
    check_plan(plan)
    assert simulate(plan, record=False).makespan_s == pytest.approx(max(g.predicted_makespan_s for g in got))


def test_no_split_below_the_size_or_with_fixed_stage_sizes_or_across_sites(small_thresholds):
    plan_groups = lambda subs, k: pytest.fail("planned a group")  # noqa: E731
    cluster, _ = _sites_cluster([18, 18])  # 36 nodes: not above DECOMPOSE_NODES
    assert D.decomposed_plan(build_problem(cluster, Workload(num_stages=4, path_length=3)), 0, plan_groups) is None
    cluster, _ = _sites_cluster([30, 20])
    fixed = Workload(num_stages=4, path_length=3, stage_sizes=(20, 10, 10, 10))
    assert D.decomposed_plan(build_problem(cluster, fixed), 0, plan_groups) is None
    cluster, _ = _sites_cluster([30, 8, 8])  # the small sites must join a big one: groups span sites
    assert D.decomposed_plan(build_problem(cluster, Workload(num_stages=4, path_length=3)), 0, plan_groups) is None


def test_islands_are_the_parts_only_trickling_links_join():
    from skippipe.cluster import parse_preset
    from skippipe.cluster_gen import random_global_cluster

    for name in ("gcp-2025/geo-distributed/20", "aws-2022/5-clusters/20", "gcp-2025/single-cluster/20"):
        assert D.islands(build_problem(parse_preset(name), Workload()).transfer_s) == [list(range(20))]
    # two sites whose link only trickles: two islands, one per site
    t = build_problem(random_global_cluster(30, seed=3, sites=2, broken=1.0), Workload()).transfer_s
    parts = D.islands(t)
    assert len(parts) == 2 and sorted(x for p in parts for x in p) == list(range(30))
    inside = max(float(t[np.ix_(p, p)].max()) for p in parts)
    across = min(float(t[np.ix_(a, b)].min()) for a in parts for b in parts if a is not b)
    assert across >= SLOW_GAP * inside


def test_a_cluster_cut_in_two_is_planned_island_by_island():
    from skippipe.cluster_gen import random_global_cluster

    cluster = random_global_cluster(40, seed=31, sites=2, broken=1.0)
    problem = build_problem(cluster, Workload(num_stages=9, path_length=4, microbatches_per_data_node=2, n_layers=27))
    plan = methods.make_plan("skippipe", problem, seed=0)
    check_plan(plan)
    part_of = {x: k for k, p in enumerate(D.islands(problem.transfer_s)) for x in p}
    assert plan.meta["candidate"] == "islands"
    for mb in plan.microbatches:  # no microbatch crosses to the other island
        assert {part_of[x] for x in mb.route()} == {part_of[mb.data_node]}
    res = simulate(plan, record=False)
    assert res.finished and res.makespan_s < float(np.asarray(problem.transfer_s).max())


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_data_nodes_move_to_quick_islands_keeping_every_total(data):
    k = data.draw(st.integers(2, 4))
    S = data.draw(st.integers(2, 5))
    rows = [[data.draw(st.integers(1, 6)) for _ in range(S)] for _ in range(k)]
    spans = [data.draw(st.floats(1.0, 100.0)) for _ in range(k)]
    single = data.draw(st.booleans())
    moved = D.moved_data_nodes(rows, spans, single)
    assert [sum(r) for r in moved] == [sum(r) for r in rows]  # every island keeps its nodes
    assert [sum(c) for c in zip(*moved)] == [sum(c) for c in zip(*rows)]  # every stage its total
    assert all(min(r) >= 1 for r in moved)  # a data node and a node of every stage per island
    if single:  # one data node at most, from the first island planned slowest
        if moved != rows:
            slow = max(range(k), key=lambda i: (spans[i], -i))
            assert moved[slow][0] == rows[slow][0] - 1
            assert sum(abs(a - b) for r, m in zip(rows, moved) for a, b in zip(r, m)) == 4  # one node each way
        return
    predicted = [s * m[0] / r[0] for s, m, r in zip(spans, moved, rows)]
    assert max(predicted) <= max(spans) + 1e-9
    if moved != rows:
        assert max(predicted) < max(spans)
    # a move is made whenever one lowers the slowest island (its makespan scaled by data nodes)
    slow = max(range(k), key=lambda i: spans[i])
    can_take = [i for i in range(k) if i != slow and max(rows[i][1:]) >= 2]
    if rows[slow][0] >= 2 and spans[slow] > max(spans[i] for i in range(k) if i != slow):
        gains = [max(spans[slow] * (rows[slow][0] - 1) / rows[slow][0], spans[i] * (rows[i][0] + 1) / rows[i][0])
                 < spans[slow] for i in can_take]
        if any(gains):
            assert moved != rows


def test_islands_tied_at_the_slowest_stay_tied_whatever_the_rounding():
    # 26.28... x 5 / 5 is one unit in the last place below 26.28...: the island with 5 data nodes
    # was then taken as quicker than its twin with 2, and the single move came from the twin
    rows, spans = [[1, 1, 1, 2], [5, 1, 1, 1], [1, 1, 1, 1], [2, 1, 1, 1]], [1.0, 26.283822016008187, 1.0, 26.283822016008187]
    assert D.moved_data_nodes(rows, spans, single=True)[1][0] == 4  # the first of the two slowest gives one


def test_a_single_move_leaves_the_slowest_island_where_moves_by_scaled_makespans_stop():
    rows, spans = [[2, 2], [2, 2], [2, 2]], [10.0, 10.0, 5.0]  # two islands tied at the slowest
    assert D.moved_data_nodes(rows, spans) == rows  # moving from both does not lower the slowest
    assert D.moved_data_nodes(rows, spans, single=True) == [[1, 3], [2, 2], [3, 1]]  # the first slowest gives one


def test_probed_rows_go_on_with_single_moves_while_the_slowest_island_gets_quicker():
    """Two sites of 20 nodes, probed by a table of makespans by data nodes: moving two data
    nodes (what the makespans scaled by data nodes ask for) makes the quick island slow, one
    data node pays; only the single moves find it, and they stop where the slowest island
    would not get quicker."""

    cluster, site_of = _sites_cluster([20, 20], speed=np.linspace(1.0, 1.4, 40))  # islands of other costs
    problem = build_problem(cluster, Workload(num_stages=4, path_length=3))
    groups = [sorted(np.flatnonzero(site_of == k).tolist()) for k in range(2)]
    table = {0: {4: 40.0, 3: 30.0, 2: 20.0}, 1: {2: 10.0, 3: 20.0, 4: 45.0}}  # island -> data nodes -> makespan
    probed: list[tuple[int, int]] = []

    def probe(subs):
        out = []
        for sub in subs:
            island = 0 if sub.cluster.name.endswith(f"from {groups[0][0]}]") else 1
            probed.append((island, sub.stage_sizes[0]))
            out.append(table[island][sub.stage_sizes[0]])
        return out

    sizes = [[4, 6, 5, 5], [2, 6, 6, 6]]
    assert [r[0] for r in D.moved_data_nodes(sizes, [40.0, 10.0])] == [2, 4]  # two moved: 45 s there
    assert D.probed_rows(problem, groups, sizes, probe) == sizes
    probed.clear()
    rows = D.probed_rows(problem, groups, sizes, probe, single_rounds=3)
    assert [r[0] for r in rows] == [3, 3]  # 30 s and 20 s: the slowest island 40 -> 30 s
    assert [sum(c) for c in zip(*rows)] == [sum(c) for c in zip(*sizes)]
    assert set(probed) == {(0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)}  # the two moved were probed too
    # a split of many moves that is not affordable is not probed; the single moves still are
    probed.clear()
    asked: list[list[list[int]]] = []
    rows = D.probed_rows(problem, groups, sizes, probe, single_rounds=3, affordable=lambda r: asked.append(r) is not None)
    assert [r[0] for r in rows] == [3, 3]
    assert [[r[0] for r in split] for split in asked] == [[2, 4]]  # asked about the many moves alone
    assert probed[:4] == [(0, 4), (1, 2), (0, 3), (1, 3)]  # the first single move next, not the two moved


def test_islands_get_data_nodes_by_their_makespans():
    from skippipe.cluster_gen import random_global_cluster
    from skippipe.planner.routing.schedule import plan_skippipe

    # sweep case 76: 101 nodes in three islands, S = L = 5, 1-4 slots; the 22-node island, given
    # data nodes for its compute, was planned at 1.5-1.9 x the others (few slots, long holds)
    cluster = random_global_cluster(101, seed=76, sites=5, speed=(0.5, 2.0), memory=(1, 4), broken=0.5)
    problem = build_problem(cluster, Workload(num_stages=5, path_length=5, microbatches_per_data_node=8, n_layers=15,
                                              max_jump=5, max_swaps=0))
    assert len(D.islands(problem.transfer_s)) == 3
    plan_groups = lambda subs, k: [plan_skippipe(sub, seed=0, budget=200) for sub in subs]  # noqa: E731
    probe_groups = lambda subs: [plan_skippipe(sub, seed=0, budget=D.PROBE_BUDGET) for sub in subs]  # noqa: E731
    first = D.decomposed_plan(problem, 0, plan_groups)
    moved = D.decomposed_plan(problem, 0, plan_groups, probe_groups)
    assert "data_nodes_moved" not in first.meta and "data_nodes_moved" in moved.meta
    for plan in (first, moved):
        check_plan(plan)
        assert [len(s) for s in plan.stages] == problem.stage_sizes
    assert sum(moved.meta["data_nodes_moved"]) == problem.stage_sizes[0]
    assert simulate(moved, record=False).makespan_s < simulate(first, record=False).makespan_s


def test_a_split_an_island_cannot_carry_is_planned_whole():
    """Two islands whose split the TC1 caps cannot route (``islands_the_caps_cannot_carry``);
    the whole cluster can be routed, so method ``skippipe`` plans it whole instead of refusing."""
    from skippipe.errors import LoadCapsTooSmall
    from skippipe.planner.routing.schedule import plan_skippipe

    problem = islands_the_caps_cannot_carry()
    assert len(D.islands(problem.transfer_s)) == 2
    with pytest.raises(LoadCapsTooSmall):
        D.decomposed_plan(problem, 0, lambda subs, groups: [plan_skippipe(sub, seed=0, budget=50) for sub in subs])
    plan = methods.make_plan("skippipe", problem, seed=0)
    check_plan(plan)
    assert "groups" not in plan.meta and simulate(plan, record=False).finished
