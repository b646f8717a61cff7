"""``skippipe simulate PLAN``: simulate one iteration of a plan.

Prints a table (per node: operations, busy, idle and waiting time), the makespan, the lower
bound and their ratio, and what the round trips are made of (compute, hops, waiting);
``--json`` prints the same as JSON (with per-node intervals);
``--gantt FILE.png`` draws the timeline. Exit code 0, or 1 when the plan cannot finish
(memory deadlock); bad input exits 2.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import numpy as np

from skippipe.bounds import compute_bound, plan_data_node_floor, plan_memory_floor
from skippipe.errors import UserError
from skippipe.fileio import check_writable
from skippipe.planfile import Plan, load_plan
from skippipe.sim import SimResult, simulate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="plan file (JSON) written by `skippipe plan` or any tool")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of the table")
    parser.add_argument("--gantt", metavar="FILE.png", help="draw the timeline as a Gantt chart PNG")
    parser.add_argument(
        "--fifo", action="store_true",
        help="ignore the plan's processing order; every node serves first ready, first served",
    )


def _round(x: float, nd: int = 4) -> float | None:
    return round(x, nd) if math.isfinite(x) else None


def summary(plan: Plan, result: SimResult) -> dict[str, Any]:
    """Everything the command reports, as plain data (the --json document)."""
    stage_of = plan.stage_of()
    end = result.makespan_s if result.finished else result.last_finish_s
    per_node: dict[int, list[dict[str, Any]]] = {x: [] for x in range(plan.n_nodes)}
    waits = [0.0] * plan.n_nodes
    for op in result.ops:
        per_node[op.node].append(
            {
                "mb": op.mb, "kind": op.kind, "start": round(op.start, 4), "end": round(op.end, 4),
                "wait": round(op.start - op.ready, 4),
            }
        )
        waits[op.node] += op.start - op.ready
    nodes = []
    for x in range(plan.n_nodes):
        busy = result.busy_s[x]
        nodes.append(
            {
                "node": x, "stage": stage_of.get(x), "ops": len(per_node[x]), "busy_s": round(busy, 4),
                "idle_s": round(max(0.0, end - busy), 4), "wait_s": round(waits[x], 4), "intervals": per_node[x],
            }
        )
    mb_wait: dict[int, float] = {}
    for op in result.ops:
        mb_wait[op.mb] = mb_wait.get(op.mb, 0.0) + op.start - op.ready
    from skippipe.planner.floors import plan_free_floor

    lb = result.lower_bound_s
    free = plan_free_floor(plan) if lb else None
    return {
        "method": plan.method,
        "n_nodes": plan.n_nodes,
        "stages": plan.stages,
        "microbatches": len(plan.microbatches),
        "finished": result.finished,
        "unfinished": result.unfinished,
        "makespan_s": _round(result.makespan_s),
        "last_finish_s": _round(result.last_finish_s),
        "lower_bound_s": _round(lb),
        "compute_bound_s": _round(compute_bound(plan)),
        "memory_floor_s": _round(plan_memory_floor(plan)) if lb else None,
        "data_node_floor_s": _round(plan_data_node_floor(plan)) if lb else None,
        "ratio": _round(result.makespan_s / lb) if lb > 0 and result.finished else None,
        "floor_all_s": _round(free.value) if free is not None else None,
        "round_trips": trip_breakdown(plan, result),
        "microbatch_wait_s": {str(k): round(v, 4) for k, v in sorted(mb_wait.items())},
        "nodes": nodes,
    }


def trip_breakdown(plan: Plan, result: SimResult) -> dict[str, float] | None:
    """Mean round trip (a microbatch's injection to its last backward) split into its compute
    (F, L, B on its route), its hops (forward and back) and the rest, waiting (for a node, a
    slot, or the gaps after operations); the slowest trip too. None when nothing finished."""
    c = plan.costs
    f = np.asarray(c.forward_s, dtype=float)
    t = np.asarray(c.transfer_s, dtype=float)
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for op in result.ops:
        first[op.mb] = min(first.get(op.mb, math.inf), op.start)
        last[op.mb] = max(last.get(op.mb, -math.inf), op.end)
    rows = []
    for mb in plan.microbatches:
        if mb.id not in first or mb.id not in result.finish_s:
            continue
        route = mb.route()
        work = f[mb.data_node] * c.own_factor + sum(f[x] * c.visit_factor for x in mb.path)
        hops = sum(t[a, b] + t[b, a] for a, b in zip(route, route[1:]))
        rows.append((mb.id, last[mb.id] - first[mb.id], work, hops))
    if not rows:
        return None
    trips = np.array([r[1:] for r in rows])
    slowest = max(rows, key=lambda r: r[1])
    mean = trips.mean(axis=0)
    return {"mean_s": round(float(mean[0]), 4), "compute_s": round(float(mean[1]), 4), "hops_s": round(float(mean[2]), 4),
            "waiting_s": round(float(mean[0] - mean[1] - mean[2]), 4), "slowest_s": round(float(slowest[1]), 4),
            "slowest_mb": int(slowest[0])}


def format_table(doc: dict[str, Any], title: str) -> str:
    lines = [title, f"{'node':>5} {'stage':>5} {'ops':>4} {'busy s':>8} {'idle s':>8} {'busy %':>7} {'wait s':>8}"]
    end = doc["makespan_s"] if doc["finished"] else doc["last_finish_s"]
    for row in doc["nodes"]:
        pct = 100.0 * row["busy_s"] / end if end else 0.0
        stage = "-" if row["stage"] is None else str(row["stage"])
        lines.append(
            f"{row['node']:>5} {stage:>5} {row['ops']:>4} {row['busy_s']:>8.2f} {row['idle_s']:>8.2f} "
            f"{pct:>6.1f}% {row['wait_s']:>8.2f}"
        )
    lines.append("")
    if doc["finished"]:
        lines.append(f"makespan      {doc['makespan_s']:.2f} s")
    else:
        stuck = doc["unfinished"]
        lines.append(
            f"makespan      did not finish: {len(stuck)} microbatch(es) never finished their backward "
            f"({', '.join(map(str, stuck[:10]))}{' ...' if len(stuck) > 10 else ''}); last finish {doc['last_finish_s']:.2f} s"
        )
    floor = doc["memory_floor_s"]
    parts = f"compute bound {doc['compute_bound_s']:.2f} s"
    if floor is not None:
        parts += f", memory floor {floor:.2f} s, data-node floor {doc['data_node_floor_s']:.2f} s"
    lines.append(f"lower bound   {doc['lower_bound_s']:.2f} s ({parts})")
    if doc["ratio"] is not None:
        lines.append(f"ratio         {doc['ratio']:.3f} (makespan / lower bound)")
    trips = doc.get("round_trips")
    if trips:
        lines.append(f"round trips   mean {trips['mean_s']:.2f} s = compute {trips['compute_s']:.2f} "
                     f"+ hops {trips['hops_s']:.2f} + waiting {trips['waiting_s']:.2f} s "
                     f"(slowest {trips['slowest_s']:.2f} s, microbatch {trips['slowest_mb']})")
    if doc.get("floor_all_s") and doc["finished"]:
        lines.append(f"floor         {doc['floor_all_s']:.2f} s over every allocation of these stage sizes "
                     f"(makespan / floor = {doc['makespan_s'] / doc['floor_all_s']:.3f})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.gantt and not str(args.gantt).lower().endswith(".png"):
        raise UserError(f"{args.gantt}: the Gantt chart is written as PNG; give a file name ending in .png")
    if args.gantt:
        check_writable(args.gantt, "Gantt chart")
    plan = load_plan(args.plan)
    order = {} if args.fifo else None  # {} = no fixed order on any node
    result = simulate(plan, processing_order=order, record=True)
    doc = summary(plan, result)
    if args.gantt:
        from skippipe.viz import gantt

        gantt(
            result.ops, args.gantt, stages=plan.stages,
            title=f"{args.plan}: {plan.method}, {doc['microbatches']} microbatches",
            makespan_s=result.makespan_s if result.finished else None, lower_bound_s=result.lower_bound_s,
        )
    if args.json:
        doc["plan"] = str(args.plan)
        if args.gantt:
            doc["gantt"] = str(args.gantt)
        print(json.dumps(doc, indent=1))
    else:
        n_stages = len(plan.stages)
        title = f"{args.plan}: method {plan.method}, {plan.n_nodes} nodes, {n_stages} stages, {doc['microbatches']} microbatches"
        print(format_table(doc, title))
        if args.gantt:
            print(f"gantt chart   {args.gantt}")
    return 0 if result.finished else 1

