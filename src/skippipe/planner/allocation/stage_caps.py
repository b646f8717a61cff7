"""Stages whose TC1 caps can carry the visits the path rules send them.

A node's TC1 cap depends only on which nodes are data nodes (``Problem.load_caps``: the visits
shared in proportion to speed), so moving nodes between stages 1..S-1 changes no cap, only the
stages' sums. The allocation search scores links, not these sums; with little freedom in the
paths (L = S: every microbatch visits every stage) a stage of slow nodes can then take fewer
visits than every microbatch must pay it, and no routing exists although the same nodes, dealt
differently, would carry it.

``balance_stage_caps`` repairs such an allocation with the fewest nodes moved. One integer
program (HiGHS) chooses a stage for every node of stages 1..S-1 (each stage keeps its size) and
how many microbatches take each valid stage order (``sequence_quotas``'s split), so that every
stage's cap sum carries its visits, moving as few nodes as it can. A feasible allocation is
returned unchanged, and so is one that no dealing of these nodes can make feasible (routing then
refuses it in one line).

``hold_balanced_stages`` deals the same nodes by the same programme for another aim: memory.
A visit holds one of its node's activation slots from its forward there to its backward, so for
the rest of the path; a node whose TC1 cap is high and whose slots are few, early in the paths,
serves its visits one at a time and holds up every microbatch behind them. The programme
minimises the largest ``cap x hold(stage) / slots`` over the nodes, where ``hold(stage)`` is the
mean number of visits from that stage to the end of a path (over the valid stage orders through
it) times the median forward and backward of a visit; the caps must still carry the visits.
``least_hold_bound`` bounds that optimum from below without the programme: the least largest
weight of any dealing that keeps the stage sizes, the caps left out (a bottleneck assignment).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import LinearConstraint, milp
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from skippipe.planner.problem import Problem
from skippipe.planner.routing.sequences import stage_cap_sums
from skippipe.planner.stage_orders import sequence_quotas, stage_sequences

# the hold-balanced dealing stops at this relative gap to its optimum (HiGHS; deterministic)
HOLD_GAP = 0.02
# a safety net on either programme (seconds of HiGHS): the suite's take well under one
SECONDS = 10.0
# and a count, so that a slow machine stops where a fast one does: branch-and-bound nodes. The
# suite's programmes up to 100 nodes need one each; the most measured, 1,699 (3.9-4.5 s on the
# 2-core machine), on a 38-node group of a 972-node cluster of sites (S = 8, L = 6, 1-2 slots)
NODE_LIMIT = 2000


@dataclass
class _Dealing:
    """Variables: y[i * k + (s - 1)] = node i of ``nodes`` in stage s; then per valid stage order
    the microbatches on it; then ``extra`` more. Rows: every node in one stage, every stage its
    size, every stage's caps carry its visits, the orders take every microbatch."""

    stages: list[list[int]]
    caps: list[int]
    seqs: tuple[tuple[int, ...], ...]
    total: int
    extra: int
    nodes: list[int] = field(init=False)
    rows: list[np.ndarray] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.nodes = [x for s in self.stages[1:] for x in s]
        k, n_y = self.k, self.n_y
        for i in range(len(self.nodes)):
            self.row(1, 1)[i * k:(i + 1) * k] = 1
        for s in range(1, len(self.stages)):
            in_s = [i * k + s - 1 for i in range(len(self.nodes))]
            self.row(len(self.stages[s]), len(self.stages[s]))[in_s] = 1
            carry = self.row(0, np.inf)
            carry[in_s] = [self.caps[x] for x in self.nodes]
            carry[[n_y + j for j, seq in enumerate(self.seqs) if s in seq]] = -1
        self.row(self.total, self.total)[n_y:n_y + len(self.seqs)] = 1

    @property
    def k(self) -> int:
        return len(self.stages) - 1

    @property
    def n_y(self) -> int:
        return len(self.nodes) * self.k

    @property
    def n_vars(self) -> int:
        return self.n_y + len(self.seqs) + self.extra

    def row(self, lo: float, hi: float) -> np.ndarray:
        r = np.zeros(self.n_vars)
        self.rows.append(r)
        self.lower.append(lo)
        self.upper.append(hi)
        return r

    def solve(self, cost: np.ndarray, gap: float | None = None) -> list[list[int]] | None:
        """The dealing that minimises ``cost`` (extra variables continuous, at least 0) within the
        relative ``gap`` of the optimum (HiGHS's default when None), or None."""
        integrality = np.concatenate([np.ones(self.n_y + len(self.seqs)), np.zeros(self.extra)])
        upper = np.concatenate([np.ones(self.n_y), np.full(len(self.seqs), self.total), np.full(self.extra, np.inf)])
        res = milp(c=cost, constraints=LinearConstraint(np.array(self.rows), self.lower, self.upper),
                   integrality=integrality, bounds=(np.zeros(self.n_vars), upper),
                   options={"time_limit": SECONDS, "node_limit": NODE_LIMIT} | ({} if gap is None else {"mip_rel_gap": gap}))
        if res.x is None:
            return None
        y = np.round(res.x[:self.n_y]).reshape(len(self.nodes), self.k)
        out = [sorted(self.stages[0])] + [
            sorted(x for i, x in enumerate(self.nodes) if y[i, s - 1] > 0.5) for s in range(1, len(self.stages))
        ]
        return out if all(len(a) == len(b) for a, b in zip(out, self.stages)) else None


def _dealing(problem: Problem, stages: list[list[int]], extra: int = 0) -> _Dealing | None:
    """The dealing programme of ``stages``; None when there is nothing to deal."""
    w = problem.workload
    seqs = stage_sequences(len(stages), w.path_length, w.max_swaps, w.max_jump)
    if not seqs or len(stages) < 3:
        return None
    return _Dealing(stages, problem.load_caps(stages), seqs, len(stages[0]) * w.microbatches_per_data_node, extra)


def balance_stage_caps(problem: Problem, stages: list[list[int]]) -> list[list[int]]:
    """``stages`` with nodes of stages 1..S-1 dealt again, fewest moved, so that the TC1 caps
    admit a routing (see the module text); where no dealing of them does, with the fastest data
    nodes traded for the slowest other nodes first (``_slower_data_nodes``)."""
    deal = _dealing(problem, stages)
    if deal is None or _carries(deal):
        return stages
    return _dealt(deal) or _slower_data_nodes(problem, deal) or stages


def _carries(deal: _Dealing) -> bool:
    """Whether the caps of the dealing's stages, as they are, admit a routing."""
    return sequence_quotas(deal.seqs, stage_cap_sums(deal.caps, deal.stages), deal.total) is not None


def _dealt(deal: _Dealing) -> list[list[int]] | None:
    """The dealing whose caps carry the visits with the fewest nodes moved, or None."""
    cost = np.zeros(deal.n_vars)
    home = {x: s for s in range(1, len(deal.stages)) for x in deal.stages[s]}
    cost[[i * deal.k + home[x] - 1 for i, x in enumerate(deal.nodes)]] = -1  # keep nodes where they are
    return deal.solve(cost)


def _slower_data_nodes(problem: Problem, deal: _Dealing) -> list[list[int]] | None:
    """The j fastest data nodes traded for the j slowest other nodes (j = 1, 2, 4, ... up to
    every data node), the first trade that some dealing makes carry the visits, dealt so; None
    when none does. A node's cap is its share of the visits by speed among the nodes outside
    stage 0, rounded up: with L = S and one-node stages (e.g. 12 nodes, S = 9, one data node)
    a fast data node can leave too few fast nodes for the stages that need a whole cap each.
    ``deal``: the programme of the allocation as it is."""
    stages = deal.stages
    speed = 1.0 / np.asarray(problem.forward_s, dtype=float)
    fastest = sorted(stages[0], key=lambda x: (-speed[x], x))
    slowest = sorted((x for st in stages[1:] for x in st), key=lambda x: (speed[x], x))
    most, j = min(len(fastest), len(slowest)), 1
    while True:
        j = min(j, most)
        trade = dict(zip(slowest[:j], fastest[:j])) | dict(zip(fastest[:j], slowest[:j]))
        traded = [sorted(trade.get(x, x) for x in st) for st in stages]
        traded_deal = _Dealing(traded, problem.load_caps(traded), deal.seqs, deal.total, 0)
        if _carries(traded_deal):
            return traded
        found = _dealt(traded_deal)
        if found is not None or j == most:
            return found
        j *= 2


def _hold_weights(problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """N x S: a node's cap x hold(stage) / slots were it dealt to that stage (column 0 unused),
    where hold(stage) is the module text's least seconds a visit there holds its slot."""
    forward = np.asarray(problem.forward_s, dtype=float)
    rest = [x for s in stages[1:] for x in s]
    unit = float(np.median(forward[rest])) * (1.0 + problem.cost_model.backward_factor)
    after, through = np.zeros(len(stages)), np.zeros(len(stages))
    for seq in seqs:
        for i, s in enumerate(seq):
            after[s] += len(seq) - i
            through[s] += 1
    hold = unit * after / np.maximum(through, 1)
    caps = np.asarray(problem.load_caps(stages), dtype=float)
    slots = np.maximum(1.0, np.asarray(problem.memory, dtype=float))
    return np.outer(caps, hold) / slots[:, None]  # (cap x hold) / slots in this order: near ties follow the last bit


def largest_hold_per_slot(problem: Problem, stages: list[list[int]]) -> float:
    """max over the nodes of stages 1..S-1 of cap x hold(stage) / slots (see the module text)."""
    w = problem.workload
    weights = _hold_weights(problem, stages, stage_sequences(len(stages), w.path_length, w.max_swaps, w.max_jump))
    return max((float(weights[x, s]) for s in range(1, len(stages)) for x in stages[s]), default=0.0)


def hold_balanced_stages(problem: Problem, stages: list[list[int]]) -> list[list[int]] | None:
    """The nodes of stages 1..S-1 dealt so that the largest slot hold per slot is least (see the
    module text); None when no dealing lets the caps carry the visits."""
    deal = _dealing(problem, stages, extra=1)
    if deal is None:
        return None
    weights = _hold_weights(problem, stages, deal.seqs)
    z = deal.n_vars - 1
    for i, x in enumerate(deal.nodes):  # z >= cap x hold / slots of every node where it is dealt
        for s in range(1, len(stages)):
            r = deal.row(0, np.inf)
            r[z] = 1
            r[i * deal.k + s - 1] = -weights[x, s]
    cost = np.zeros(deal.n_vars)
    cost[z] = 1
    return deal.solve(cost, HOLD_GAP)


def least_hold_bound(problem: Problem, stages: list[list[int]]) -> float:
    """A lower bound on the largest slot hold per slot of every dealing of the nodes of stages
    1..S-1 that keeps the stage sizes, ``hold_balanced_stages``'s among them: the least t such
    that each node has a stage of weight at most t and the stages' sizes hold them all (a
    bottleneck assignment, the TC1 caps left out; 0 when there is nothing to deal). It is one of
    the weights of ``largest_hold_per_slot``, so ``largest_hold_per_slot`` of any such dealing
    is at least it, bit for bit."""
    w = problem.workload
    rest = [x for s in stages[1:] for x in s]
    if not rest or len(stages) < 2:
        return 0.0
    weights = _hold_weights(problem, stages, stage_sequences(len(stages), w.path_length, w.max_swaps, w.max_jump))
    seat_stage = np.repeat(np.arange(1, len(stages)), [len(s) for s in stages[1:]])  # one column per place
    cost = weights[np.ix_(rest, seat_stage)]  # node x place
    values = np.unique(cost)
    lo, hi = 0, len(values) - 1  # the answer is values[hi]: dealing the nodes as they are fits it
    while lo < hi:
        mid = (lo + hi) // 2
        if _all_seated(cost <= values[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(values[hi])


def _all_seated(allowed: np.ndarray) -> bool:
    """Whether every row (node) gets a column (place) of its own among those ``allowed``."""
    matched = maximum_bipartite_matching(csr_matrix(allowed.astype(np.int8)), perm_type="column")
    return bool((matched >= 0).all())
