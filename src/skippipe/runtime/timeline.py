"""The timeline of a real run, per node: forward/loss/backward, waits and transfers, drawn as a
Gantt chart beside the simulator's prediction for the same plan.

Workers write ``RUN/timeline/node-NNN.json`` (records with times in real seconds since the
iteration's start barrier). Times are shown in *plan seconds* (real seconds / time scale under
emulation), so the measured and the simulated charts share one axis. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COLORS = {"F": "#4C72B0", "L": "#DD8452", "B": "#55A868"}
WAIT_COLOR = "#DDDDDD"
TRANSFER_COLOR = "#8172B3"


@dataclass
class Op:
    node: int
    mb: int
    kind: str
    start: float
    end: float


def load_timeline(run_dir: str | Path) -> tuple[list[dict[str, Any]], float]:
    """All records of all nodes, and the time scale they were taken under."""
    folder = Path(run_dir) / "timeline"
    records: list[dict[str, Any]] = []
    scale = 1.0
    for f in sorted(folder.glob("node-*.json")):
        data = json.loads(f.read_text())
        scale = float(data.get("time_scale", 1.0))
        records.extend(data["records"])
    return records, scale


def iterations(records: list[dict[str, Any]]) -> list[int]:
    return sorted({int(r["it"]) for r in records})


def ops_of(records: list[dict[str, Any]], iteration: int, scale: float = 1.0) -> list[Op]:
    return [
        Op(r["node"], r["mb"], r["kind"], r["start"] / scale, r["end"] / scale)
        for r in records if r["type"] == "op" and r["it"] == iteration
    ]


def makespan(records: list[dict[str, Any]], iteration: int, data_nodes: list[int], scale: float = 1.0) -> float:
    """Last backward on a data node, in plan seconds (the simulator's definition)."""
    ends = [r["end"] for r in records if r["type"] == "op" and r["it"] == iteration and r["kind"] == "B" and r["node"] in data_nodes]
    return max(ends) / scale if ends else float("nan")


def draw(
    path: str | Path,
    records: list[dict[str, Any]],
    iteration: int,
    n_nodes: int,
    scale: float,
    predicted: list[Any] | None = None,
    predicted_makespan: float | None = None,
    title: str = "",
) -> Path:
    """Gantt PNG: the measured iteration (top) and the simulator's prediction (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    panels = [("measured", records)] + ([("simulated", predicted)] if predicted is not None else [])
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 0.32 * n_nodes * len(panels) + 2), sharex=True, squeeze=False)
    xmax = 0.0
    for ax, (name, data) in zip(axes[:, 0], panels):
        if name == "measured":
            for r in data:
                if r["it"] != iteration or "start" not in r:
                    continue
                s, e = r["start"] / scale, r["end"] / scale
                xmax = max(xmax, e)
                if r["type"] == "op":
                    ax.barh(r["node"], e - s, left=s, height=0.7, color=COLORS[r["kind"]], edgecolor="white", linewidth=0.3)
                elif r["type"] == "wait":
                    ax.barh(r["node"], e - s, left=s, height=0.25, color=WAIT_COLOR)
                elif r["type"] == "transfer":
                    ax.barh(r["dst"] + 0.42, e - s, left=s, height=0.12, color=TRANSFER_COLOR, alpha=0.6)
            label = f"measured (iteration {iteration + 1})"
        else:
            for op in data:
                xmax = max(xmax, op.end)
                ax.barh(op.node, op.end - op.start, left=op.start, height=0.7, color=COLORS[op.kind], edgecolor="white", linewidth=0.3)
            label = "simulated" + (f" (makespan {predicted_makespan:.1f} s)" if predicted_makespan else "")
        ax.set_ylabel("node")
        ax.set_yticks(range(n_nodes))
        ax.set_yticklabels([str(i) for i in range(n_nodes)], fontsize=7)
        ax.set_ylim(n_nodes - 0.4, -0.6)
        ax.set_title(label, fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("plan seconds" + (f" (real seconds / {scale:g})" if scale != 1.0 else ""))
    axes[-1, 0].set_xlim(0, xmax * 1.02 if xmax else 1)
    handles = [Patch(color=COLORS[k], label=t) for k, t in (("F", "forward"), ("L", "head + loss"), ("B", "backward"))]
    handles += [Patch(color=WAIT_COLOR, label="waiting"), Patch(color=TRANSFER_COLOR, label="transfer (to this node)")]
    fig.legend(handles=handles, loc="upper right", ncol=5, fontsize=8)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)
    return out
