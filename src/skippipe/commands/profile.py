"""``skippipe profile``: measure the workers of a launch and write a cluster file for ``skippipe plan``.

    skippipe profile --nodes 4 --out cluster.json                       # 4 local workers
    skippipe profile --nodes 4 --emulate gcp-2025/geo-distributed/4 --out cluster.json
    torchrun --nnodes 4 --nproc-per-node 1 ... -m skippipe.cli profile --worker --out cluster.json

Each pair of workers ping-pongs at several message sizes (latency + bytes / bandwidth is fitted),
each worker times a stage's forward and backward and finds its usable memory; rank 0 writes the
file (``transfer_s`` or ``latency_ms`` + ``bandwidth_GBps``, ``forward_s``, ``memory``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from skippipe.errors import UserError
from skippipe.fileio import check_writable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="FILE.json", help="the cluster file to write")
    parser.add_argument("--nodes", type=int, default=4, metavar="N", help="local workers to start (default 4)")
    parser.add_argument("--worker", action="store_true",
                        help="be one worker of a launch (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
    parser.add_argument("--model", default="tiny", help="model preset whose stage is timed (default tiny)")
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages: a stage holds n_layers / S layers (default 4)")
    parser.add_argument("--samples", type=int, default=8, help="samples per microbatch (default 8)")
    parser.add_argument("--sizes", metavar="B,B,..", help="message sizes in bytes (default: 1 KiB .. one microbatch)")
    parser.add_argument("--reps", type=int, default=5, help="timed round trips per pair and size (default 5)")
    parser.add_argument("--compute-reps", type=int, default=5, help="timed forward + backward passes per node (default 5)")
    parser.add_argument("--links", choices=("transfer", "latency"), default="transfer",
                        help="write transfer_s for this model's activations (default), or latency_ms + bandwidth_GBps")
    parser.add_argument("--emulate", metavar="CLUSTER", help="emulate this cluster's links here (preset/file)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="real s per cluster s under --emulate (default 1)")
    parser.add_argument("--memory-fraction", type=float, default=0.9, help="share of free memory a node may fill (default 0.9)")
    parser.add_argument("--max-slots", type=int, default=64, help="activation slots written at most per node (default 64)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda (cuda:LOCAL_RANK) or cuda:N (default cpu)")
    parser.add_argument("--timeout", type=float, default=120.0, help="longest wait for any message, seconds (default 120)")
    parser.add_argument("--rendezvous-timeout", type=float, default=60.0, help="longest wait for all workers (default 60)")
    parser.add_argument("--deadline", type=float, default=1800.0, help="local launch: give up after this many s (default 1800)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def spec_from_args(args: argparse.Namespace) -> Any:
    from skippipe.runtime.profile.spec import ProfileSpec

    sizes: tuple[int, ...] = ()
    if args.sizes:
        try:
            sizes = tuple(int(x) for x in args.sizes.replace(" ", "").split(",") if x)
        except ValueError:
            raise UserError(f"--sizes must be comma-separated byte counts, e.g. 1024,1048576; got {args.sizes!r}") from None
    return ProfileSpec(
        out=args.out, model=args.model, stages=args.stages, samples=args.samples, sizes=sizes, reps=args.reps,
        compute_reps=args.compute_reps, links=args.links, emulate=args.emulate, time_scale=args.time_scale,
        memory_fraction=args.memory_fraction, max_slots=args.max_slots, device=args.device,
        timeout_s=args.timeout, rendezvous_timeout_s=args.rendezvous_timeout,
    )


def _size(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GiB"


def summary(doc: dict[str, Any], emulated: Any | None) -> dict[str, Any]:
    """The figures the command prints: per pair its fitted links (and errors against the emulated
    cluster), per node its compute and memory."""
    from skippipe.runtime.profile.fit import link_errors, links_of

    prof = doc["profile"]
    measured = links_of(doc)
    out: dict[str, Any] = {"nodes": prof["nodes"], "model": prof["model"], "sizes_bytes": prof["sizes_bytes"],
                           "time_scale": prof["time_scale"], "forward_s": doc["forward_s"],
                           "backward_factor": prof["backward_factor"], "memory": doc["memory"], "pairs": []}
    errors = None
    if emulated is not None:
        errors = link_errors(measured, emulated.latency_ms, emulated.bandwidth_GBps, prof["activation_message_bytes"])
        out["errors"] = errors.summary()
    n = measured.n
    k = 0
    for i in range(n):
        for j in range(i + 1, n):
            row: dict[str, Any] = {"pair": [i, j], "latency_ms": float(measured.latency_ms[i, j]),
                                   "bandwidth_GBps": float(measured.bandwidth_GBps[i, j])}
            if emulated is not None and errors is not None:
                row.update(emulated_latency_ms=float(emulated.latency_ms[i, j]),
                           emulated_bandwidth_GBps=float(emulated.bandwidth_GBps[i, j]), latency_error=errors.latency[k],
                           bandwidth_error=errors.bandwidth[k], transfer_error=errors.transfer[k])
            out["pairs"].append(row)
            k += 1
    return out


def format_summary(s: dict[str, Any], out: str) -> str:
    m = s["model"]
    sizes = s["sizes_bytes"]
    lines = [
        f"workers      {s['nodes']}; stage of {m['layers_per_stage']} layers (d_model {m['d_model']}, ctx {m['ctx']}), "
        f"{m['samples']} samples per microbatch",
        f"links        latency + bytes / bandwidth fitted on {len(sizes)} sizes ({_size(sizes[0])} .. {_size(sizes[-1])})"
        + (f"; times in cluster seconds (measured / {s['time_scale']:g})" if s["time_scale"] != 1 else ""),
    ]
    emulated = "errors" in s
    head = f"  {'pair':>7} {'latency ms':>11} {'GiB/s':>9}"
    if emulated:
        head += f" {'emul. ms':>9} {'err':>7} {'emul. GiB/s':>11} {'err':>7} {'transfer err':>12}"
    lines.append(head)
    for r in s["pairs"]:
        line = f"  {r['pair'][0]:>3}-{r['pair'][1]:<3} {r['latency_ms']:>11.2f} {r['bandwidth_GBps']:>9.4f}"
        if emulated:
            line += (f" {r['emulated_latency_ms']:>9.2f} {r['latency_error']:>+7.1%} {r['emulated_bandwidth_GBps']:>11.4f}"
                     f" {r['bandwidth_error']:>+7.1%} {r['transfer_error']:>+12.1%}")
        lines.append(line)
    if emulated:
        e = s["errors"]
        lines.append(f"error        |latency| median {e['latency_median']:.1%} max {e['latency_max']:.1%}; "
                     f"|bandwidth| median {e['bandwidth_median']:.1%} max {e['bandwidth_max']:.1%}; "
                     f"|transfer| median {e['transfer_median']:.1%} max {e['transfer_max']:.1%}")
    lines.append("forward s    " + " ".join(f"{x:.4f}" for x in s["forward_s"]))
    lines.append("bwd / fwd    " + " ".join(f"{x:.2f}" for x in s["backward_factor"]))
    lines.append("memory       " + " ".join(str(x) for x in s["memory"]) + " activation slots")
    lines.append(f"wrote        {out}  (skippipe plan --cluster {out} ...)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from skippipe.runtime.profile.spec import ProfileSpec

    spec: ProfileSpec = spec_from_args(args)
    out = Path(spec.out)
    if out.suffix.lower() != ".json":
        raise UserError(f"--out {out}: cluster files written by profile are JSON; give a name ending in .json")
    check_writable(out, "cluster file")
    from skippipe.model.config import get_preset

    if get_preset(spec.model).n_layers < spec.stages:
        raise UserError(f"--stages {spec.stages}: model {spec.model!r} has only {get_preset(spec.model).n_layers} layers")
    if args.worker:
        from skippipe.runtime.profile.worker import run_profile_worker

        return run_profile_worker(spec)
    from skippipe.runtime.profile.emulated import EmulatedLinks
    from skippipe.runtime.profile.launch import launch_profile

    # a bad --emulate fails here, before any worker starts
    emulated = EmulatedLinks.load(spec.emulate, args.nodes, spec.time_scale) if spec.emulate else None
    launch_profile(spec, args.nodes, args.deadline)
    doc = json.loads(out.read_text())
    s = summary(doc, emulated)
    print(json.dumps(s, indent=1) if args.json else format_summary(s, str(out)))
    return 0
