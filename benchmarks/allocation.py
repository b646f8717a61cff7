"""How much better is our node -> stage allocation than random allocations?

For each cluster: our allocation (``allocate``, seed 0) against K random allocations
(``random_allocation``: random stage sizes as the workload wants, data nodes from the same
candidates). For every allocation: its fitness (worst intra-stage link + 2 x closed tour of
bottleneck matchings) and the simulated makespan of the full pipeline, random skipping and
SkipPipe without TC2 and SkipPipe planned on it (``--no-skippipe`` leaves out the slower,
collision-aware SkipPipe).
Printed: our value, the median and best of the random ones, and ours / median (< 1: better).
All figures come from this one run.

    python benchmarks/allocation.py                      # 4 clusters, 6 random allocations each
    python benchmarks/allocation.py --random 20 --no-skippipe --clusters gcp20-current-free
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
from tqdm import tqdm

from skippipe.cluster import load_cluster
from skippipe.errors import UserError
from skippipe.planner.allocation import allocate, allocation_fitness, random_allocation
from skippipe.planner.methods import make_plan, with_allocation
from skippipe.planner.problem import build_problem
from skippipe.workload import Workload

CLUSTERS = ["gcp20-current-free", "gcp-2025/geo-distributed/20", "aws-2022/geo-distributed/20", "gcp-2025/5-clusters/40"]


def measure(problem, stages, methods: list[str]) -> dict[str, float]:
    """Fitness and simulated makespans of the methods planned on one allocation."""
    fixed = with_allocation(problem, stages)
    row = {"fitness": allocation_fitness(problem, stages)}
    for method in methods:
        try:
            row[method] = make_plan(method, fixed, seed=0).predicted_makespan_s
        except UserError:  # e.g. a random draw that deadlocks every time under tight memory
            row[method] = math.inf
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clusters", nargs="+", default=CLUSTERS)
    ap.add_argument("--random", type=int, default=6, help="random allocations per cluster (default 6)")
    ap.add_argument("--no-skippipe", action="store_true", help="leave out the (slower) collision-aware skippipe method")
    args = ap.parse_args(argv)
    methods = ["full", "random", "skippipe-no-tc2"] + ([] if args.no_skippipe else ["skippipe"])
    columns = ["fitness", *methods]

    print(f"{'cluster':<30} {'measure':<16} {'ours':>9} {'rnd med':>9} {'rnd best':>9} {'ours/med':>9}")
    summary: dict[str, list[float]] = {c: [] for c in columns}
    for spec in args.clusters:
        problem = build_problem(load_cluster(spec), Workload())
        if problem.fixed_stages is not None:
            print(f"{spec}: the cluster fixes its allocation; skipped", file=sys.stderr)
            continue
        start = time.perf_counter()
        ours_stages = allocate(problem, seed=0)
        alloc_s = time.perf_counter() - start
        ours = measure(problem, ours_stages, methods)
        rng = np.random.default_rng(12345)
        randoms = [
            measure(problem, random_allocation(problem, rng), methods)
            for _ in tqdm(range(args.random), desc=spec, leave=False, disable=None)
        ]
        for col in columns:
            vals = np.array([r[col] for r in randoms])
            med, best = float(np.median(vals)), float(vals.min())
            ratio = ours[col] / med
            summary[col].append(ratio)
            print(f"{spec:<30} {col:<16} {ours[col]:>9.2f} {med:>9.2f} {best:>9.2f} {ratio:>9.3f}")
        print(f"{spec:<30} {'allocation time':<16} {alloc_s:>8.2f}s  ({problem.n} nodes)")
    print()
    for col in columns:
        if summary[col]:
            gm = float(np.exp(np.mean(np.log(summary[col]))))
            print(f"geometric mean of ours / random median, {col:<16} {gm:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
