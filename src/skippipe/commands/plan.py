"""``skippipe plan``: cluster + workload -> plan file.

    skippipe plan --cluster gcp-2025/geo-distributed/20 --method skippipe --out plan.json

The cluster is a preset ``TABLE/SETTING/N``, a shipped example name or a JSON/TOML file; the
workload comes from ``--workload FILE`` and/or the flags below (flags win). The plan is checked
(CC1-CC3, TC1) and simulated before it is written; bad input of any kind is one line on stderr,
exit code 2, and no file.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from skippipe.errors import UserError
from skippipe.fileio import check_writable
from skippipe.limits import FLOAT_LIMIT, INT_LIMIT

# flag (dest) -> Workload field
WORKLOAD_FLAGS = {
    "stages": "num_stages",
    "path_length": "path_length",
    "microbatches": "microbatches_per_data_node",
    "samples": "samples_per_microbatch",
    "memory": "memory",
    "max_swaps": "max_swaps",
    "max_jump": "max_jump",
    "layers": "n_layers",
    "d_model": "d_model",
    "ctx": "ctx",
}


def add_problem_arguments(parser: argparse.ArgumentParser) -> None:
    """Cluster and workload flags shared by ``plan`` and ``compare``."""
    g = parser.add_argument_group("cluster and workload")
    g.add_argument("--cluster", required=True, metavar="SPEC",
                   help="preset TABLE/SETTING/N (e.g. gcp-2025/geo-distributed/20), a shipped example "
                        "(e.g. gcp20-current-free) or a cluster file (.json/.toml)")
    g.add_argument("--workload", metavar="FILE", help="workload file (.toml or .json); the flags below override it")
    from skippipe.workload import Workload

    d = Workload()  # the defaults, for the help texts
    g.add_argument("--stages", type=int, metavar="S",
                   help=f"number of stages, stage 0 = data nodes (default {d.num_stages})")
    g.add_argument("--path-length", type=int, metavar="L",
                   help=f"stages each microbatch visits, stage 0 included (default {d.path_length})")
    g.add_argument("--microbatches", type=int, metavar="m",
                   help=f"microbatches per data node (default {d.microbatches_per_data_node})")
    g.add_argument("--samples", type=int, metavar="b", help=f"samples per microbatch (default {d.samples_per_microbatch})")
    g.add_argument("--memory", type=int, metavar="M",
                   help=f"activation slots per node, unless the cluster says otherwise (default {d.memory})")
    g.add_argument("--max-swaps", type=int, metavar="K", help=f"swaps of adjacent stages per path (default {d.max_swaps})")
    g.add_argument("--max-jump", type=int, metavar="J",
                   help=f"a visit may go at most J stages past the highest stage reached so far (default {d.max_jump}: "
                        f"at most {d.max_jump - 1} stages skipped at once)")
    g.add_argument("--layers", type=int, metavar="N", help=f"model layers (default {d.n_layers})")
    g.add_argument("--d-model", type=int, metavar="D", help=f"model width, sets the activation size (default {d.d_model})")
    g.add_argument("--ctx", type=int, metavar="T", help=f"context length, sets the activation size (default {d.ctx})")
    g.add_argument("--stage-sizes", metavar="A,B,..", help="nodes per stage, e.g. 5,3,3,3,3,3 (default: balanced load)")


def add_planning_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0,
                        help="random seed (>= 0); plans are deterministic per seed (default %(default)s)")
    parser.add_argument("--time-limit", type=float, metavar="SEC",
                        help="cut the search short after this many seconds (per method)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_problem_arguments(parser)
    from skippipe.planner.methods import method_names

    parser.add_argument("--method", default="skippipe", choices=method_names(), help="planning method (default %(default)s)")
    add_planning_arguments(parser)
    parser.add_argument("--out", required=True, metavar="FILE.json", help="where to write the plan")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


# ------------------------------------------------------------------------------ building the problem


def workload_from_args(args: argparse.Namespace) -> Any:
    """The workload file (if any) with the command-line flags on top; errors are ``WorkloadError``s."""
    from skippipe.config_fields import read_config_file
    from skippipe.errors import WorkloadError
    from skippipe.workload import workload_from_dict

    data: dict[str, Any] = {}
    where = "workload"
    if getattr(args, "workload", None):
        where = str(args.workload)
        data = read_config_file(args.workload, error=WorkloadError, what="workload file")
        if "workload" in data:  # a [workload] table, or the keys at the top level
            extra = sorted(str(key) for key in data if key != "workload")
            if extra:
                raise WorkloadError(f"unknown top-level key(s) {', '.join(extra)} beside [workload]", where=where, key=extra[0])
            where = f"{where} [workload]"
            data = data["workload"]
            if not isinstance(data, dict):
                raise WorkloadError("[workload] must be a table", where=str(args.workload), key="workload")
        data = dict(data)
    for flag, field in WORKLOAD_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            data[field] = value
    if getattr(args, "stage_sizes", None):
        data["stage_sizes"] = _parse_sizes(args.stage_sizes)
    memory = data.get("memory")
    if isinstance(memory, int) and not isinstance(memory, bool) and memory < 1:
        raise WorkloadError(f"memory M={memory} is too small to make any plan: every node needs at least 1 activation slot")
    return workload_from_dict(data, where=where)


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UserError(f"--stage-sizes must be comma-separated integers, e.g. 5,3,3,3,3,3; got {text!r}") from None
    if not sizes:
        raise UserError("--stage-sizes is empty")
    return sizes


def problem_from_args(args: argparse.Namespace) -> Any:
    from skippipe.cluster import load_cluster
    from skippipe.planner.problem import build_problem

    if args.time_limit is not None and not 0 < args.time_limit <= FLOAT_LIMIT:
        raise UserError(f"--time-limit must be > 0 seconds and finite, got {args.time_limit}")
    seed = getattr(args, "seed", 0)
    if not 0 <= seed <= INT_LIMIT:
        raise UserError(f"--seed must be >= 0, got {seed}" if seed < 0 else f"--seed must be at most 2**31, got {seed}")
    workload = workload_from_args(args)
    cluster = load_cluster(args.cluster)
    return build_problem(cluster, workload)


# ------------------------------------------------------------------------------ output


def plan_summary(plan: Any, problem: Any) -> dict[str, Any]:
    from skippipe.planner.floors import free_allocation_floor, keeps_cluster_caps

    w = problem.workload
    lb = plan.lower_bound_s
    ms = plan.predicted_makespan_s
    floor_all = None  # over every allocation: not for a fixed one, nor for caps looser than the cluster's
    if problem.fixed_stages is None and keeps_cluster_caps(plan, problem):
        floor_all = free_allocation_floor(problem).value
    return {
        "method": plan.method,
        "cluster": problem.cluster.name,
        "nodes": problem.n,
        "stage_sizes": [len(s) for s in plan.stages],
        "stages": plan.stages,
        "path_length": plan.constraints.path_length,
        "num_stages": w.num_stages,
        "microbatches": len(plan.microbatches),
        "seed": plan.seed,
        "makespan_s": ms,
        "lower_bound_s": lb,
        "ratio": (ms / lb) if lb and ms and math.isfinite(ms) else None,
        "planning_s": plan.meta.get("planning_s"),
        "floor_all_s": floor_all,
        "ratio_all": (ms / floor_all) if floor_all and ms and math.isfinite(ms) else None,
    }


def format_summary(doc: dict[str, Any]) -> str:
    sizes = "+".join(str(x) for x in doc["stage_sizes"])
    lines = [
        f"method       {doc['method']} (seed {doc['seed']})",
        f"cluster      {doc['cluster']}: {doc['nodes']} nodes, stages {sizes}",
        f"paths        {doc['microbatches']} microbatches, L={doc['path_length']} of S={doc['num_stages']} stages",
        f"makespan     {doc['makespan_s']:.2f} s per iteration (simulated)",
    ]
    if doc["lower_bound_s"]:
        lines.append(f"lower bound  {doc['lower_bound_s']:.2f} s (makespan / bound = {doc['ratio']:.3f})")
    if doc.get("floor_all_s"):
        lines.append(f"floor        {doc['floor_all_s']:.2f} s over every allocation (makespan / floor = {doc['ratio_all']:.3f})")
    if doc["planning_s"] is not None:
        lines.append(f"planned in   {doc['planning_s']:.2f} s")
    return "\n".join(lines)


def progress(desc: str, total: int) -> Any:
    """A progress bar on stderr, shown only when stderr is a terminal; without tqdm's monitor
    thread, so that the planner may fork its workers (``planner.routing.workers``)."""
    from tqdm import tqdm

    tqdm.monitor_interval = 0
    return tqdm(total=total, desc=desc, unit="step", disable=None, leave=False, file=sys.stderr)


# ------------------------------------------------------------------------------ command


def run(args: argparse.Namespace) -> int:
    import json

    from skippipe.planfile import save_plan
    from skippipe.planner.methods import make_plan

    out = Path(args.out)
    if out.suffix.lower() != ".json":
        raise UserError(f"--out {out}: plan files are JSON; give a name ending in .json")
    check_writable(out, "plan file")
    start = time.perf_counter()
    with progress(f"planning ({args.method})", 2) as bar:
        problem = problem_from_args(args)
        bar.update(1)
        plan = make_plan(args.method, problem, seed=args.seed, time_limit_s=args.time_limit)
        bar.update(1)
    save_plan(plan, out)
    doc = plan_summary(plan, problem)
    doc["total_s"] = round(time.perf_counter() - start, 3)
    doc["out"] = str(out)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(format_summary(doc))
        print(f"wrote        {out}")
    return 0
