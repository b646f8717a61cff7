"""Stages that route over fast links alone, chosen by one integer programme per data-node set.

The exchanges of ``slow_link_search.slow_link_allocation`` move two nodes at a time and stop where
no single exchange lowers the relaxed routing cost. Where every path visits nearly every stage
(L close to S) and half the links are broken, that can be far from an allocation that needs
no slow link at all: a generated 11-node cluster (S = L = 5, one slot a node) kept five
microbatches on slow links (2,319.24 s) while such an allocation exists (187.06 s with it).

``fast_stages(problem, data, seqs, fast)``: for the data nodes ``data``, a mixed-integer
programme (HiGHS) chooses the stage of every other node (0/1 variables, the stage sizes kept)
and routes each data node's m microbatches along the graph of the valid stage orders
(``order_graph``) over ``fast`` links alone, as fractional flows, every node within the TC1
caps that ``data`` gives and visited only in its own stage. It returns the stages it finds;
``infeasible`` says that HiGHS proved there are none (then no allocation with these data nodes
routes over fast links alone, not even fractionally); a programme that needs more than
``NODE_LIMIT`` branch-and-bound nodes finds nothing and proves nothing. The integer routing on
the stages is ``slow_links``' own.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from skippipe.planner.allocation.fitness import data_node_scores
from skippipe.planner.problem import Problem, shared_caps
from skippipe.planner.routing.order_graph import order_graph
from skippipe.planner.routing.slow_links import MILP_SECONDS, min_cost_routing

# the columns of the programmes one search may solve (``fast_allocation``), and the largest
# programme it builds, in stage variables x columns: above, a programme can take seconds (a
# 19-node cluster, S = L = 6: 80 x 1,776, 1.3-2.5 s each); an 11-node one with S = L = 5
# (36 x 315) takes 10-50 ms
FAST_WORK = 3_000
FAST_CELLS = 50_000
# branch-and-bound nodes per programme (deterministic); those that need more are given up
NODE_LIMIT = 200


@dataclass(frozen=True)
class FastStages:
    stages: list[list[int]] | None  # stage 0 = the data nodes; None: none found
    infeasible: bool  # proved: no stages with these data nodes route over fast links alone


def fast_stages(
    problem: Problem, data: tuple[int, ...], seqs: tuple[tuple[int, ...], ...], fast: np.ndarray
) -> FastStages:
    """Stages under which every microbatch of ``data`` routes over ``fast`` links alone (see the
    module text)."""
    sizes, m = list(problem.stage_sizes), problem.workload.microbatches_per_data_node
    others = [x for x in range(problem.n) if x not in data]
    caps = dict(zip(others, shared_caps(problem.forward_s, others, len(data) * m * len(seqs[0]))))
    graph = order_graph(seqs)
    stage_var = {(x, s): i for i, (x, s) in enumerate(itertools.product(others, range(1, len(sizes))))}
    # flow columns: (data node, state, node, stage entered, next state, next node)
    cols: list[tuple[int, int, int, int, int, int]] = []
    for d in data:
        for q, stage, nxt in graph.steps:
            tails = [d] if q == 0 else others
            cols += [(d, q, u, stage, nxt, v) for u in tails for v in others if u != v and fast[u, v]]
        cols += [(d, graph.final, u, 0, -1, d) for u in others if fast[u, d]]
    rows: list[dict[int, float]] = []
    bounds: list[tuple[float, float]] = []
    for x in others:  # one stage each
        rows.append({stage_var[x, s]: 1.0 for s in range(1, len(sizes))})
        bounds.append((1, 1))
    for s in range(1, len(sizes)):  # the stage sizes
        rows.append({stage_var[x, s]: 1.0 for x in others})
        bounds.append((sizes[s], sizes[s]))
    into: dict[tuple[int, int, int], list[int]] = {}  # (data node, state, node) -> columns in
    out: dict[tuple[int, int, int], list[int]] = {}  # and out
    entering: dict[tuple[int, int], list[int]] = {}  # (node, stage) -> columns that visit it there
    visiting: dict[int, list[int]] = {}  # node -> columns that visit it
    for j, (d, q, u, stage, nxt, v) in enumerate(cols):
        k = len(stage_var) + j
        out.setdefault((d, q, u), []).append(k)
        if nxt >= 0:
            into.setdefault((d, nxt, v), []).append(k)
            entering.setdefault((v, stage), []).append(k)
            visiting.setdefault(v, []).append(k)
    for d in data:  # each data node sends its m microbatches
        rows.append(dict.fromkeys(out.get((d, 0, d), []), 1.0))
        bounds.append((m, m))
    for key in sorted(into.keys() | (out.keys() - {(d, 0, d) for d in data})):  # conservation
        rows.append({**dict.fromkeys(into.get(key, []), 1.0), **dict.fromkeys(out.get(key, []), -1.0)})
        bounds.append((0, 0))
    for x in others:  # the caps
        rows.append(dict.fromkeys(visiting.get(x, []), 1.0))
        bounds.append((0, caps[x]))
    for (x, s), ks in entering.items():  # a visit in stage s only to a node of stage s
        rows.append({**dict.fromkeys(ks, 1.0), stage_var[x, s]: -float(caps[x])})
        bounds.append((-np.inf, 0))
    size = len(stage_var) + len(cols)
    matrix = coo_matrix(([v for r in rows for v in r.values()],
                         ([i for i, r in enumerate(rows) for _ in r], [k for r in rows for k in r])),
                        shape=(len(rows), size)).tocsr()
    lower, upper = zip(*bounds)
    res = milp(np.zeros(size), constraints=LinearConstraint(matrix, lower, upper),
               integrality=np.r_[np.ones(len(stage_var)), np.zeros(len(cols))], bounds=Bounds(0, np.inf),
               options={"node_limit": NODE_LIMIT, "time_limit": MILP_SECONDS})
    if res.x is None:
        return FastStages(None, infeasible=res.status == 2)
    stages: list[list[int]] = [list(data)] + [[] for _ in sizes[1:]]
    for (x, s), i in stage_var.items():
        if res.x[i] > 0.5:
            stages[s].append(x)
    return FastStages(stages, infeasible=False)


def programme_columns(problem: Problem, data: tuple[int, ...], seqs: tuple[tuple[int, ...], ...], fast: np.ndarray) -> int:
    """The size of ``fast_stages``' programme for a work estimate: its stage variables and at most
    its flow columns (the hops out of and back to the data nodes counted over every link)."""
    others = np.array([x for x in range(problem.n) if x not in data])
    pairs = int(fast[np.ix_(others, others)].sum() - np.trace(fast[np.ix_(others, others)]))
    graph = order_graph(seqs)
    inner = sum(1 for q, _, _ in graph.steps if q != 0)
    return len(data) * (inner * pairs + len(graph.steps) * len(others) + len(others)) + len(others) * (problem.num_stages - 1)


def fast_allocation(
    problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...], slow: np.ndarray, work: int = 0,
) -> tuple[list[list[int]], dict[int, list[tuple[int, ...]]]] | None:
    """An allocation whose integer routing keeps to fast links, and that routing: the data
    nodes of ``stages`` first, then each set one exchange away (a data node for a node outside
    stage 0, the quickest data nodes by ``data_node_scores`` first), while the programmes'
    columns stay within ``work`` (``FAST_WORK`` when 0) and each within ``FAST_CELLS``. None
    when none is found."""
    fast = ~slow
    np.fill_diagonal(fast, False)
    data = tuple(sorted(stages[0]))
    order = [int(x) for x in np.argsort(data_node_scores(problem), kind="stable")]
    sets = [data] + [tuple(sorted({*data} - {out} | {into})) for into in order if into not in data
                     for out in sorted(data, key=order.index, reverse=True)]
    left = work or FAST_WORK
    binaries = (problem.n - len(data)) * (problem.num_stages - 1)
    for cand in dict.fromkeys(sets):
        columns = programme_columns(problem, cand, seqs, fast)
        left -= columns
        if left < 0 or binaries * columns > FAST_CELLS:
            return None
        found = fast_stages(problem, cand, seqs, fast).stages
        if found is None:
            continue
        routing = min_cost_routing(problem, found, seqs, slow, integral=True, fast_only=True)
        if routing is not None and routing.paths is not None:
            return found, routing.paths
    return None
