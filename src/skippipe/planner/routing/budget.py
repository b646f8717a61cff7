"""The default work of ``plan_skippipe``, counted so that a plan does not depend on the machine.

Two counts: the simulations the search may run (``default_budget``) and the allocation seeds
whose starts are built and compared before the search (``allocation_starts``). Both keep an
estimate of the planning CPU, from counts alone, within the planning-time target (10 s up to
40 nodes, rising to 30 s at 100 and 60 s at 1,000).
"""

from __future__ import annotations

from skippipe.planner.problem import Problem

# above this many nodes the default budget shrinks with the square of the size
BUDGET_FULL_NODES = 200
# at any size the budget also keeps simulations x operations of one iteration within
# PLANNING_SHARE of the planning-time target (10 s up to 40 nodes, 30 s at 100, 60 s at 1,000): heavy workloads
# (long paths, many microbatches) simulate longer. SIM_OP_S is the planning CPU time per
# simulation and operation of one iteration, measured on the 2-core machine: 2.4-2.7 us on the
# 100-node suite clusters, 3.0 us on the 40-node one, 2.4-4.6 us on generated 30-40-node ones
SIM_OP_S = 3.0e-6
PLANNING_SHARE = 0.9
# the planning CPU of one more start (allocation search and the candidate routings on it,
# before the path search) per N^2 x S, measured on the 2-core machine over 92 clusters of 8-60
# nodes (the suite's up to 40 nodes and generated ones): 0.93 ms at most, 0.28 ms the median
# (counts of operations or stages alone predict it worse: up to 7.5 x the median)
START_S = 1.0e-3
# allocation seeds compared at most (the user's seed and the next ones)
MAX_STARTS = 4
# above BUDGET_FULL_NODES nodes the search's simulations leave START_SHARE of the target to the
# start (the allocation and the candidate routings before the search), whose CPU counts predict
# badly there. Measured on the 2-core machine, on the nine drawn clusters of 402-985 nodes that
# are planned whole (``benchmarks/scheduler_heavy_large.py``, both draws): the start took 11-20 %
# of the target where the search's estimate fills half of it or more, 15-22 % elsewhere and
# 41-62 % where the budget by size is small (847-985 nodes, L = 7-8); a 448-node cluster (S = 5,
# L = 3, 7 microbatches, 149 data nodes), its search estimated at 90 % of the target, planned
# in 39.2-45.8 s of 41.6 s
START_SHARE = 0.2


def operations(problem: Problem) -> int:
    """Operations of one iteration: every microbatch's injection, L-1 forwards, the loss and L
    backwards."""
    w = problem.workload
    return int(problem.stage_sizes[0]) * w.microbatches_per_data_node * (2 * w.path_length + 1)


def planning_target_s(n: int) -> float:
    """The planning-time target of the default budget: 10 s up to 40 nodes, 30 s at 100, 60 s
    from 1,000 (linear in between)."""
    if n <= 100:
        return 10.0 + 20.0 * max(0, n - 40) / 60
    return 30.0 + 30.0 * min(1.0, (n - 100) / 900)


def default_budget(problem: Problem) -> int:
    """Simulations the search may run when no other budget is given: 4,800 at 20 nodes, 8,000
    from 100 to 200 nodes; above that 8,000 x (200 / N)^2 (320 at 1,000 nodes), because a
    simulation of the critical component grows with the cluster (on an uneven 1,000-node
    cluster the components span hundreds of nodes) and planning must stay within a minute.
    At any size fewer where one iteration has many operations (``SIM_OP_S``): a 40-node
    cluster with L = 7 and 8 microbatches per data node took 12.1 s with 5,600, a 201-node
    one with L = 8 47.2 s with 7,920. Above ``BUDGET_FULL_NODES`` nodes within
    ``START_SHARE`` less of the target."""
    full = int(4000 + 40 * min(problem.n, 100))
    large = problem.n > BUDGET_FULL_NODES
    share = (PLANNING_SHARE - (START_SHARE if large else 0.0)) * planning_target_s(problem.n)
    limit = int(share / (SIM_OP_S * operations(problem)))
    if not large:
        return max(500, min(full, limit))
    return max(100, min(limit, int(full * (BUDGET_FULL_NODES / problem.n) ** 2)))


def allocation_starts(problem: Problem, budget: int, first_extra_s: float = 0.0) -> int:
    """How many allocation seeds ``plan_skippipe`` builds starts for under the default budget
    (1 to ``MAX_STARTS``): the first, and as many more as fit, each estimated at ``START_S`` x
    N^2 x S, beside the search's ``budget`` simulations at ``SIM_OP_S`` x operations (an
    estimate that counts the first start), within ``PLANNING_SHARE`` of the planning-time
    target. Up to about 16 nodes with light workloads that is four; from 30 nodes one.
    ``first_extra_s``: the estimated CPU of work the first start did beyond that (its searches
    around slow links, ``slow_links.programme_s``), expected of each start."""
    room = PLANNING_SHARE * planning_target_s(problem.n) - budget * operations(problem) * SIM_OP_S - first_extra_s
    one = START_S * problem.n**2 * problem.workload.num_stages + first_extra_s
    return max(1, min(MAX_STARTS, 1 + int(room / one)))
