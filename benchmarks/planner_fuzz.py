"""Adversarial planning: random clusters and workloads at the edges of what the tools accept,
every method, every check that holds for any plan.

Each case is drawn from its number: S = 2..9 stages (``--most-stages``), L = 2..S, S to 40 nodes, 1 to 17
microbatches per data node, 1 to 6 activation slots (or 1-4 per node), ``max_jump`` 1-8 (raised
to what L and S need in 85 % of the draws: the others may be refused as drawn), ``max_swaps``
0-2, compute even, 0.5-2x or 0.05-3x, one site, random places on the globe, or those with 30 %
of the links between sites broken (trickling).
Every method plans it with its default settings; a plan must then

- be made, or be refused with a one-line ``UserError`` (no other exception);
- pass the plan-file validation (CC1-CC3 and its TC1 caps);
- simulate to the makespan the planner predicted;
- take no less than its lower bound, nor than the floor over every allocation where that floor
  is reported for it (``plan_free_floor``);
- for ``skippipe``: be no slower than the ``skippipe-no-tc2``, ``naive`` and ``random`` plans of
  the case (its safety net), where those are made;
- be planned within ``--timeout`` seconds.

    python3 benchmarks/planner_fuzz.py [--first 0] [--count 40] [--methods naive random ...] [--timeout 240]
        [--microbatches m] [--largest 40] [--most-stages 9]

Prints one line per case and method and a count of failed checks; exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time

from skippipe.cluster_gen import random_global_cluster, single_site_cluster
from skippipe.errors import UserError
from skippipe.planfile import plan_violations
from skippipe.planner.floors import plan_free_floor
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import Problem, build_problem
from skippipe.sim import simulate
from skippipe.workload import Workload, least_max_jump

METHODS = ("naive", "random", "skippipe-no-tc2", "skippipe")
SAFETY_NET = ("skippipe-no-tc2", "naive", "random")


class PlanningTimeout(Exception):
    pass


def _alarm(signum, frame) -> None:
    raise PlanningTimeout


def case(k: int, microbatches: int | None = None, largest: int = 40, most_stages: int = 9) -> tuple[str, Problem]:
    """Case ``k``: a description and its problem (``UserError`` where the draw is refused);
    ``microbatches`` per data node instead of the drawn number where given, S to ``largest``
    nodes, 2 to ``most_stages`` stages (the same draw otherwise)."""
    rng = random.Random(k)
    S = rng.randint(2, most_stages)
    L = rng.randint(2, S)
    n = rng.randint(S, largest)
    m = rng.choice([1, 1, 2, 3, 6, 9, 17])
    m = m if microbatches is None else microbatches
    mem = rng.choice([1, 1, 2, 3, 6])
    kind = rng.choice(["one site", "global", "global, broken links"])
    speed = rng.choice([None, (0.5, 2.0), (0.05, 3.0)])
    slots = rng.choice([None, (1, 1), (1, 4)])
    jump, swaps = rng.choice([1, 2, 4, 8]), rng.choice([0, 1, 2])
    if rng.random() < 0.85:  # most at least the least that reaches the last stage, the others refused as drawn
        jump = max(jump, least_max_jump(S, L))
    text = f"{kind}, N={n} S={S} L={L} m={m} slots={slots or mem} speed={speed or 'even'} jump={jump} swaps={swaps}"
    if kind == "one site":
        cluster = single_site_cluster(n, seed=k, speed=speed, memory=slots)
    else:
        cluster = random_global_cluster(n, seed=k, sites=rng.choice([None, 2, 5]), speed=speed, memory=slots,
                                        broken=0.3 if kind == "global, broken links" else 0.0)
    workload = Workload(num_stages=S, path_length=L, microbatches_per_data_node=m, memory=mem, max_swaps=swaps,
                        max_jump=jump)
    return text, build_problem(cluster, workload)


def checked(method: str, problem: Problem, seed: int, timeout: int) -> tuple[float | None, list[str], float, str]:
    """(makespan or None where refused, failed checks, planning seconds, the refusal) of one method."""
    signal.alarm(timeout)
    start = time.perf_counter()
    try:
        plan = make_plan(method, problem, seed=seed)
    except UserError as err:
        lines = [] if "\n" not in str(err) else [f"a refusal of more than one line: {err!r}"]
        return None, lines, time.perf_counter() - start, str(err).splitlines()[0]
    except PlanningTimeout:
        return None, [f"not planned within {timeout} s"], float(timeout), ""
    except Exception as err:  # noqa: BLE001 - the check is that nothing else escapes
        return None, [f"{type(err).__name__}: {err}"], time.perf_counter() - start, ""
    finally:
        signal.alarm(0)
    seconds = time.perf_counter() - start
    failed = [f"invalid: {v}" for v in plan_violations(plan)[:2]]
    result = simulate(plan, record=False)
    span = result.makespan_s
    if abs(span - plan.predicted_makespan_s) > 1e-6 * max(1.0, span):
        failed.append(f"simulated {span:.4f} s, predicted {plan.predicted_makespan_s:.4f} s")
    if span < result.lower_bound_s - 1e-6:
        failed.append(f"{span:.4f} s below its lower bound {result.lower_bound_s:.4f} s")
    floor = plan_free_floor(plan) if method == "skippipe" else None
    if floor is not None and span < floor.value - 1e-6:
        failed.append(f"{span:.4f} s below the floor over every allocation {floor.value:.4f} s")
    return span, failed, seconds, ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--timeout", type=int, default=240, help="seconds one method may plan one case")
    ap.add_argument("--microbatches", type=int, default=None, help="per data node in every case (default: drawn)")
    ap.add_argument("--largest", type=int, default=40, help="nodes in a case at most")
    ap.add_argument("--most-stages", type=int, default=9, help="stages in a case at most (S)")
    args = ap.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    failures = planned = refused = 0
    for k in range(args.first, args.first + args.count):
        try:
            text, problem = case(k, args.microbatches, args.largest, args.most_stages)
        except UserError as err:
            print(f"case {k}: refused as drawn ({err})")
            continue
        spans: dict[str, float] = {}
        for method in args.methods:
            span, failed, seconds, why = checked(method, problem, k % 3, args.timeout)
            if span is not None:
                spans[method] = span
            if method == "skippipe" and span is not None:
                failed += [f"slower than {o} ({spans[o]:.2f} s)" for o in SAFETY_NET if spans.get(o, span) < span - 1e-6]
            planned += span is not None
            refused += span is None and not failed
            failures += len(failed)
            shown = f"refused ({why})" if span is None else f"{span:.2f} s"
            print(f"case {k} [{text}] {method}: {shown} in {seconds:.1f} s" + "".join(f"\n  FAILED {f}" for f in failed),
                  flush=True)
    print(f"{planned} plans, {refused} refused with one line, {failures} failed checks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
