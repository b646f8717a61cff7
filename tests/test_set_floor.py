"""The floor of one data-node set keeps round trips off the set's other data nodes."""

from __future__ import annotations

import itertools
import math
from unittest.mock import patch

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_strategies import generated_problems
from skippipe.cluster import Cluster
from skippipe.cluster_gen import random_global_cluster
from skippipe.errors import UserError
from skippipe.planner import set_floor
from skippipe.planner.floors import _enumerated_trips, free_allocation_floor, set_floors
from skippipe.planner.methods import make_plan, with_allocation
from skippipe.planner.problem import build_problem
from skippipe.planner.set_floor import SetFloor, chain_floors, covered_floor, least_dealings
from skippipe.workload import Workload


def small_problems():
    return generated_problems(stages=(3, 6), max_path=4, extra_nodes=2, max_nodes=12, single_site_memory=True)


def _brute_avoiding(problem, d, data):
    """(round trip, time out, time back) of d over every tuple of L-1 distinct nodes off ``data``."""
    hops = problem.workload.path_length - 1
    t = np.asarray(problem.transfer_s, dtype=float)
    f = np.asarray(problem.forward_s, dtype=float)
    cm = problem.cost_model
    own = f[d] * (1 + cm.backward_factor + cm.loss_factor)
    visit = f * (1 + cm.backward_factor)
    best = [math.inf, math.inf, math.inf]
    for tup in itertools.permutations([x for x in range(problem.n) if x not in data], hops):
        walk = (d, *tup, d)
        hop_out = sum(t[a, b] for a, b in itertools.pairwise(walk))
        hop_back = sum(t[b, a] for a, b in itertools.pairwise(walk))
        trip = own + max(sum(visit[x] for x in tup) + hop_out + hop_back, cm.inject_gap_s + cm.op_gap_s)
        out = hop_out + sum(f[x] for x in tup)
        back = hop_back + sum(f[x] * cm.backward_factor for x in tup)
        best = [min(best[0], trip), min(best[1], out), min(best[2], back)]
    return best


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems(), st.data())
def test_round_trips_off_the_set_match_brute_force(problem, data):
    *_, trips = _enumerated_trips(problem)
    D = int(problem.stage_sizes[0])
    chosen = data.draw(st.lists(st.sampled_from(range(problem.n)), min_size=D, max_size=D, unique=True))
    in_set = np.zeros(problem.n, dtype=bool)
    in_set[chosen] = True
    for d in chosen:
        got = trips.avoiding(d, in_set)
        want = _brute_avoiding(problem, d, chosen)
        assert np.allclose(got, want, rtol=1e-9, atol=1e-9) or (math.isinf(got[0]) and math.isinf(want[0]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1.0, 2.0, 3.0, 5.0, math.inf]), st.integers(1, 3)), min_size=1, max_size=4),
       st.integers(1, 8))
def test_covered_floor_is_the_best_dealing_of_the_visits(nodes, visits):
    through = np.array([t for t, _ in nodes])
    caps = np.array([c for _, c in nodes])
    best = math.inf  # every way to deal the visits under the caps: the dearest node it uses
    for dealt in itertools.product(*(range(c + 1) for c in caps)):
        if sum(dealt) == visits:
            best = min(best, max(t for t, k in zip(through, dealt) if k))
    got = covered_floor(through, caps, visits)
    assert got == best or (caps.sum() < visits and math.isinf(best))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 3), st.sampled_from([0.5, 1.0, 2.5, 4.0]), st.sampled_from([0.5, 1.0, 2.0]),
       st.sampled_from([0.0, 0.1]))
def test_chain_floors_are_below_every_split_of_the_trips(m, chains, slow, fast, og):
    # c trips through a dear node (at least slow) and m - c others, every one at least fast
    k = min(chains, m)
    got = chain_floors(m, np.array([k]), np.array([slow]), np.array([fast]), og)[0, 0]
    assert (np.diff(got) >= 0).all()  # least_dealings relies on it
    slow = max(slow, fast)
    for c in range(m + 1):
        best = math.inf  # every split of c slow and m - c fast trips over k chains run back to back
        for chain_of in itertools.product(range(k), repeat=m):
            length = [0.0] * k
            count = [0] * k
            for i, ch in enumerate(chain_of):
                length[ch] += slow if i < c else fast
                count[ch] += 1
            best = min(best, max(t + max(0, n - 1) * og for t, n in zip(length, count)))
        assert got[c] <= best + 1e-9


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0, math.inf]), min_size=1, max_size=4),
                min_size=1, max_size=3), st.integers(0, 9))
def test_least_dealing_is_the_best_dealing(rows, count):
    width = min(len(r) for r in rows)
    floors = np.array([np.sort(r[:width]) for r in rows])  # non-decreasing in c
    best = math.inf  # every dealing of at least count items, row i taking c_i < width
    for dealt in itertools.product(range(width), repeat=len(rows)):
        if sum(dealt) >= count:
            best = min(best, max(floors[i, c] for i, c in enumerate(dealt)))
    assert least_dealings(floors[None], np.array([count]))[0] == best
    with patch.object(set_floor, "BROADCAST_CELLS", 0):  # the row-by-row way of many microbatches
        assert least_dealings(floors[None], np.array([count]))[0] == best


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.lists(st.integers(1, 4), min_size=1, max_size=5),
       st.lists(st.floats(0.0, 60.0), min_size=1, max_size=6), st.integers(0, 10_000))
def test_both_ways_of_least_dealings_agree_on_chain_floors(m, chains, slow, seed):
    rng = np.random.default_rng(seed)
    fast = np.round(rng.random(len(chains)) * 20, 1)
    floors = chain_floors(m, np.array(chains), np.array(slow), fast, 0.13)
    counts = rng.integers(0, len(chains) * m + 2, len(slow))
    with patch.object(set_floor, "BROADCAST_CELLS", 10**12):
        broadcast = least_dealings(floors, counts)
    with patch.object(set_floor, "BROADCAST_CELLS", 0):
        by_rows = least_dealings(floors, counts)
    assert np.array_equal(broadcast, by_rows)


def test_dear_trips_through_a_node_behind_broken_links_raise_the_floor(monkeypatch):
    # 8 nodes on the globe, half the links broken, one slot each, every node visited by its
    # caps (30 visits, 5 per node): one node has a single fast link, so each of its 5 visits is a
    # trip over a broken link, and two one-slot data nodes run those trips one after another
    problem = build_problem(random_global_cluster(8, seed=4131, memory=(1, 1), broken=0.5),
                            Workload(num_stages=7, path_length=4, microbatches_per_data_node=5, max_jump=2,
                                     max_swaps=1))
    floor = free_allocation_floor(problem).value
    plan = make_plan("skippipe", problem, seed=0)
    assert floor <= plan.predicted_makespan_s + 1e-6
    # the dear trips counted as slot chains (the dear schedules, which count them too, left out)
    monkeypatch.setattr(SetFloor, "dear_schedules", lambda self, data, *args: 0.0)
    chains = free_allocation_floor(problem).value
    monkeypatch.setattr(SetFloor, "dear", lambda self, data: 0.0)
    without = free_allocation_floor(problem).value
    assert chains > 2 * without  # 1,997.87 s against 900.07 s (the plan: 3,285.44 s)
    assert floor > 1.3 * chains  # with the data nodes' own schedules: 2,617.35 s


def test_visits_the_near_nodes_cannot_take_cross_a_broken_link():
    # 10 nodes on the globe, 40 % of the links broken, one slot each, no skipping: the nodes
    # near any set of data nodes cannot take all its visits, so some round trip is far dearer
    # than every data node's own (floor 213.5 s before); every plan stays above the floor
    cluster = random_global_cluster(10, seed=149, memory=(1, 1), broken=0.4)
    problem = build_problem(cluster, Workload(num_stages=3, path_length=3, microbatches_per_data_node=6,
                                              max_swaps=0, max_jump=1))
    floor = free_allocation_floor(problem)
    assert floor.value > 3 * float(set_floors(problem).tf[list(floor.data_nodes)].max())
    for method in ("naive", "skippipe-no-tc2"):
        assert make_plan(method, problem, seed=0).predicted_makespan_s >= floor.value - 1e-9


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems(), st.data())
def test_must_visit_nodes_are_those_the_plans_caps_cannot_spare(problem, data):
    D = int(problem.stage_sizes[0])
    chosen = data.draw(st.lists(st.sampled_from(range(problem.n)), min_size=D, max_size=D, unique=True))
    others = [x for x in range(problem.n) if x not in chosen]
    caps = problem.load_caps([chosen, others])  # the caps every plan with these data nodes carries
    visits = D * problem.workload.microbatches_per_data_node * (problem.workload.path_length - 1)
    want = [x for x in others if sum(caps[y] for y in others if y != x) < visits]
    got = set_floors(problem, exact=False).must_visit(tuple(chosen))
    assert got.tolist() == want


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems(), st.sampled_from(["naive", "random", "skippipe-no-tc2"]), st.integers(0, 10_000))
def test_set_floor_is_below_every_plan_with_those_data_nodes(problem, method, seed):
    # any allocation: its stage 0 is the data-node set whose floor must stay below the plan
    rng = np.random.default_rng(seed)
    order = [int(x) for x in rng.permutation(problem.n)]
    stages, at = [], 0
    for size in problem.stage_sizes:
        stages.append(sorted(order[at:at + size]))
        at += size
    sets = set_floors(problem)
    value = sets.value(tuple(stages[0]))
    assert value >= sets.spread(tuple(stages[0])) - 1e-9
    try:
        plan = make_plan(method, with_allocation(problem, stages), seed=0)
    except UserError:  # no valid path, caps or memory deadlock on this allocation: nothing to bound
        return
    assert value <= plan.predicted_makespan_s + 1e-6


def _two_sites() -> Cluster:
    """Nodes 0 and 1 side by side with 3 slots; 2-4 far away, side by side, with 1 slot."""
    far = 0.35 + 0.12 + 0.5  # overhead, latency and a slow link
    t = np.full((5, 5), far)
    t[:2, :2] = 0.001
    t[2:, 2:] = 0.001
    np.fill_diagonal(t, 0.0)
    return Cluster(name="two sites", n=5, transfer_s=t, forward_s=np.ones(5), memory=np.array([3, 3, 1, 1, 1]))


def test_two_data_nodes_side_by_side_no_longer_serve_each_other():
    # 4 microbatches per data node: a data node with one slot runs its round trips one by one,
    # so the best data nodes are 0 and 1, and then every round trip crosses to the far site
    problem = build_problem(_two_sites(), Workload(num_stages=3, path_length=2, microbatches_per_data_node=4,
                                                   stage_sizes=(2, 2, 1), max_jump=2))
    sets = set_floors(problem)
    # with 0 and 1 both data nodes, each one's fastest round trip was a visit to the other
    assert sets.value((0, 1)) > sets.spread((0, 1)) + 1.0
    floor = free_allocation_floor(problem)
    assert floor.data_nodes == (0, 1)
    before = max(floor.capacity_s, min(sets.spread(tuple(s)) for s in itertools.combinations(range(5), 2)))
    assert floor.value > before + 5.0  # 12.27 -> 18.39 s
    # and it stays below the best plan over every allocation
    made = []
    for data in itertools.combinations(range(5), 2):
        rest = [x for x in range(5) if x not in data]
        for last in rest:
            stages = [list(data), [x for x in rest if x != last], [last]]
            for method in ("naive", "skippipe"):
                made.append(make_plan(method, with_allocation(problem, stages), seed=0).predicted_makespan_s)
    assert floor.value <= min(made) + 1e-6  # 19.77 s
