"""How far are ``skippipe`` plans from what an exact solver finds? (needs ``pip install ortools``)

For suite clusters (``skippipe.cluster_gen.suite``) this keeps the allocation ``skippipe`` chose
and gives the whole scheduling problem on it to the CP-SAT solver of OR-Tools: which nodes each
microbatch visits and when every operation runs, under the simulator's rules (one operation at a
time per node with its gap after it, every hop's transfer time, activation slots held from a
forward to the backward on the same node, the TC1 caps, the path rules CC1-CC3 without swaps).
The solver starts from the ``skippipe`` plan's paths as a hint. Its best schedule becomes a
plan (paths + processing orders), which is validated and simulated like any other; the table
prints that simulated makespan beside the ``skippipe`` plan's and the solver's own lower
bound. Times are rounded up to 10 ms in the model, so the simulated plan is never slower than
the model says.

The model leaves swaps out (a valid restriction: its plans obey the rules) and the allocation
fixed, so it is not a proof of optimality; it answers "does a much better plan exist on this
allocation that a search of minutes can find?" CP-SAT with more than one worker is not
deterministic: runs differ a little.

    python3 benchmarks/scheduler_exact.py --kind "single site, uneven" --nodes 24 --seconds 300 --workers 8

``--fix-paths`` keeps ``skippipe``'s paths too and leaves only the processing orders to the solver:
how far the order search is from the best orders for those paths.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np

from skippipe.cluster_gen import suite
from skippipe.planfile import Microbatch, Plan, plan_violations
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import Problem, build_problem
from skippipe.sim import simulate

try:
    from ortools.sat.python import cp_model
except ImportError as exc:  # pragma: no cover - optional dependency
    raise SystemExit("scheduler_exact: needs OR-Tools (python3 -m pip install ortools)") from exc

TICKS_PER_S = 100  # the model's time unit: 10 ms


def ticks(seconds: float, down: bool = False) -> int:
    """Seconds as model ticks, rounded up (the model never runs an operation faster than real: its
    schedules are real plans) or, ``down``, rounded down (never slower: its bound is a real bound)."""
    if down:
        return int(math.floor(seconds * TICKS_PER_S + 1e-9))
    return int(math.ceil(seconds * TICKS_PER_S - 1e-9))


@dataclass
class MicrobatchVars:
    data_node: int
    inject: cp_model.IntVar  # start of the forward on the data node
    loss: cp_model.IntVar
    last: cp_model.IntVar  # start of the final backward on the data node
    visits: dict[int, cp_model.IntVar]  # node -> is visited (bool)
    forward: dict[int, cp_model.IntVar]  # node -> start of its forward
    backward: dict[int, cp_model.IntVar]


class ExactModel:
    """The CP-SAT model of one iteration on a fixed allocation (see the module text): the stages
    and microbatches of ``plan`` (its paths only as a hint), every schedule within ``horizon_s``
    (default: twice the plan's makespan and a minute), durations rounded up or, with
    ``round_down``, down (then its optimum is at most the real one)."""

    def __init__(self, problem: Problem, plan: Plan, horizon_s: float | None = None, round_down: bool = False) -> None:
        self.problem, self.plan, self.down = problem, plan, round_down
        self.model = cp_model.CpModel()
        if horizon_s is None:
            horizon_s = 2.0 * float(plan.predicted_makespan_s or 0.0) + 60.0
        self.horizon = ticks(horizon_s)
        self.makespan = self.model.NewIntVar(0, self.horizon, "makespan")
        n = problem.n
        self.ops: list[list[cp_model.IntervalVar]] = [[] for _ in range(n)]  # per node: operation + its gap
        self.holds: list[list[cp_model.IntervalVar]] = [[] for _ in range(n)]  # per node: activation slot held
        self.visits_of: list[list[cp_model.IntVar]] = [[] for _ in range(n)]
        self.mbs = [self._microbatch(mb) for mb in plan.microbatches]
        caps = problem.load_caps(plan.stages)
        for x in range(n):
            if self.ops[x]:
                self.model.AddNoOverlap(self.ops[x])
                self.model.AddCumulative(self.holds[x], [1] * len(self.holds[x]), int(problem.memory[x]))
            if self.visits_of[x]:
                self.model.Add(sum(self.visits_of[x]) <= caps[x])
        by_node: dict[int, list[MicrobatchVars]] = {}
        for v in self.mbs:  # a data node's microbatches are interchangeable: inject them in id order
            by_node.setdefault(v.data_node, []).append(v)
        for group in by_node.values():
            for a, b in zip(group, group[1:]):
                self.model.Add(a.inject <= b.inject)
        self.model.Minimize(self.makespan)

    def _ticks(self, seconds: float) -> int:
        return ticks(seconds, self.down)

    def _op(self, node: int, start: cp_model.IntVar, seconds: float, gap: float, present=None) -> None:
        size = self._ticks(seconds + gap)
        if present is None:
            self.ops[node].append(self.model.NewFixedSizeIntervalVar(start, size, ""))
        else:
            self.ops[node].append(self.model.NewOptionalFixedSizeIntervalVar(start, size, present, ""))

    def _hold(self, node: int, start: cp_model.IntVar, end: cp_model.LinearExpr, present=None) -> None:
        m = self.model
        length = m.NewIntVar(0, self.horizon, "")
        if present is None:
            m.Add(length == end - start)
            self.holds[node].append(m.NewIntervalVar(start, length, end, ""))
        else:
            m.Add(length == end - start).OnlyEnforceIf(present)
            m.Add(length == 0).OnlyEnforceIf(present.Not())
            self.holds[node].append(m.NewOptionalIntervalVar(start, length, end, present, ""))

    def _microbatch(self, mb: Microbatch) -> MicrobatchVars:
        p, m = self.problem, self.model
        cm, w = p.cost_model, p.workload
        f = np.asarray(p.forward_s, dtype=float)
        t = np.asarray(p.transfer_s, dtype=float)
        d, stages, H = mb.data_node, self.plan.stages, self.horizon
        tk = self._ticks
        v = MicrobatchVars(d, m.NewIntVar(0, H, ""), m.NewIntVar(0, H, ""), m.NewIntVar(0, H, ""), {}, {}, {})
        self._op(d, v.inject, f[d], cm.inject_gap_s)
        self._op(d, v.loss, f[d] * cm.loss_factor, cm.op_gap_s)
        self._op(d, v.last, f[d] * cm.backward_factor, cm.op_gap_s)
        self._hold(d, v.inject, v.last + tk(f[d] * cm.backward_factor))
        m.Add(self.makespan >= v.last + tk(f[d] * cm.backward_factor))
        used = {}
        for s in range(1, len(stages)):
            for x in stages[s]:
                v.visits[x] = m.NewBoolVar("")
                v.forward[x], v.backward[x] = m.NewIntVar(0, H, ""), m.NewIntVar(0, H, "")
                self.visits_of[x].append(v.visits[x])
                self._op(x, v.forward[x], f[x], cm.op_gap_s, v.visits[x])
                self._op(x, v.backward[x], f[x] * cm.backward_factor, cm.op_gap_s, v.visits[x])
                self._hold(x, v.forward[x], v.backward[x] + tk(f[x] * cm.backward_factor), v.visits[x])
            used[s] = m.NewBoolVar("")
            m.Add(sum(v.visits[x] for x in stages[s]) == used[s])
        m.Add(sum(used.values()) == w.path_length - 1)
        S = len(stages)
        for s in range(S):  # s -> u: consecutive visited stages (stage 0: leaving the data node)
            for u in range(s + 1, S):
                both = ([used[s]] if s else []) + [used[u]] + [used[r].Not() for r in range(s + 1, u)]
                if u - s > w.max_jump:
                    m.AddBoolOr([lit.Not() for lit in both])
                    continue
                step = m.NewBoolVar("")
                m.AddBoolAnd(both).OnlyEnforceIf(step)
                m.AddBoolOr([lit.Not() for lit in both] + [step])
                for x in ([d] if s == 0 else stages[s]):
                    for y in stages[u]:
                        on = [step, v.visits[y]] + ([v.visits[x]] if s else [])
                        if s == 0:
                            m.Add(v.forward[y] >= v.inject + tk(f[d] + t[d, y])).OnlyEnforceIf(on)
                            m.Add(v.last >= v.backward[y] + tk(f[y] * cm.backward_factor + t[y, d])).OnlyEnforceIf(on)
                        else:
                            m.Add(v.forward[y] >= v.forward[x] + tk(f[x] + t[x, y])).OnlyEnforceIf(on)
                            m.Add(v.backward[x] >= v.backward[y] + tk(f[y] * cm.backward_factor + t[y, x])).OnlyEnforceIf(on)
            if s:  # s is the last visited stage: on to the loss and back
                top = m.NewBoolVar("")
                alone = [used[s]] + [used[r].Not() for r in range(s + 1, S)]
                m.AddBoolAnd(alone).OnlyEnforceIf(top)
                m.AddBoolOr([lit.Not() for lit in alone] + [top])
                for x in stages[s]:
                    m.Add(v.loss >= v.forward[x] + tk(f[x] + t[x, d])).OnlyEnforceIf([top, v.visits[x]])
                    m.Add(v.backward[x] >= v.loss + tk(f[d] * cm.loss_factor + t[d, x])).OnlyEnforceIf([top, v.visits[x]])
        return v

    def hint(self, plan: Plan) -> None:
        for mb, v in zip(plan.microbatches, self.mbs):
            for x, lit in v.visits.items():
                self.model.AddHint(lit, x in mb.path)

    def fix_paths(self, plan: Plan) -> None:
        """Every microbatch visits exactly the nodes of its path in ``plan``."""
        for mb, v in zip(plan.microbatches, self.mbs):
            for x, lit in v.visits.items():
                self.model.Add(lit == int(x in mb.path))

    def to_plan(self, solver: cp_model.CpSolver) -> Plan:
        """The solver's schedule as a plan: paths in stage order, each node's operations in start order."""
        stages = self.plan.stages
        events: dict[int, list[tuple[int, str]]] = {}
        mbs = []
        for mb, v in zip(self.plan.microbatches, self.mbs):
            path = [x for s in stages[1:] for x in s if solver.Value(v.visits[x])]
            mbs.append(Microbatch(id=mb.id, data_node=v.data_node, path=path))
            starts = [(v.data_node, v.inject, "F"), (v.data_node, v.loss, "L"), (v.data_node, v.last, "B")]
            starts += [(x, var, kind) for x in path for var, kind in ((v.forward[x], "F"), (v.backward[x], "B"))]
            for node, var, kind in starts:
                events.setdefault(node, []).append((solver.Value(var), f"{kind}{mb.id}"))
        order = {x: [tok for _, tok in sorted(ev)] for x, ev in events.items()}
        return self.problem.make_plan(stages, mbs, "exact-model", self.plan.seed, processing_order=order)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", default="single site, uneven", help="suite cluster kind (prefix)")
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--seconds", type=float, default=60.0, help="CP-SAT wall-clock limit")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--fix-paths", action="store_true", help="keep skippipe's paths: only the orders are free")
    args = ap.parse_args()
    cases = [c for c in suite(0, args.nodes) if c.cluster.n == args.nodes and c.kind.startswith(args.kind)]
    if not cases:
        raise SystemExit(f"scheduler_exact: no suite cluster of kind {args.kind!r} with {args.nodes} nodes")
    case = cases[0]
    problem = build_problem(case.cluster, case.workload())
    t0 = time.process_time()
    plan = make_plan("skippipe", problem, seed=0)
    plan_cpu = time.process_time() - t0
    ours = simulate(plan, record=False).makespan_s
    exact = ExactModel(problem, plan)
    exact.hint(plan)
    if args.fix_paths:
        exact.fix_paths(plan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = args.seconds
    solver.parameters.num_workers = args.workers
    print(f"{case.kind}, {problem.n} nodes: skippipe {ours:.2f} s (planned in {plan_cpu:.1f} s CPU); "
          f"CP-SAT on its allocation{' and paths' if args.fix_paths else ''} for {args.seconds:.0f} s with "
          f"{args.workers} workers ...", flush=True)
    status = solver.Solve(exact.model)
    bound = solver.BestObjectiveBound() / TICKS_PER_S
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        print(f"CP-SAT found no schedule ({solver.StatusName(status)}); its lower bound {bound:.2f} s")
        return
    best = exact.to_plan(solver)
    bad = plan_violations(best)
    res = simulate(best, record=False)
    print(f"{'cluster':24s} {'N':>4s} {'skippipe':>9s} {'exact-model':>12s} {'model':>8s} {'CP bound':>9s} {'ratio':>6s} valid")
    print(f"{case.kind:24s} {problem.n:4d} {ours:9.2f} {res.makespan_s:12.2f} {solver.ObjectiveValue() / TICKS_PER_S:8.2f} "
          f"{bound:9.2f} {res.makespan_s / ours:6.3f} {'yes' if not bad and res.finished else 'NO'}")


if __name__ == "__main__":
    main()
