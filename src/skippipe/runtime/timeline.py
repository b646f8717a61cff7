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

from skippipe.viz import GanttPanel, gantt_panels


@dataclass
class Op:
    node: int
    mb: int
    kind: str
    start: float
    end: float


def prune_records(records: list[dict[str, Any]], it: int, wanted: int, keep: int = 5) -> None:
    """In place: keep the detailed records of the last ``keep`` iterations up to ``it`` (and of
    iteration ``wanted``); per-iteration summaries are always kept."""
    records[:] = [r for r in records if r["type"] == "iteration" or r["it"] > it - keep or r["it"] == wanted]


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


def makespan(records: list[dict[str, Any]], iteration: int, data_nodes: list[int], scale: float = 1.0) -> float:
    """Last backward on a data node, in plan seconds (the simulator's definition)."""
    ends = [
        r["end"] for r in records
        if r["type"] == "op" and r["it"] == iteration and r["kind"] == "B" and r["node"] in data_nodes
    ]
    return max(ends) / scale if ends else float("nan")


def _spans(records: list[dict[str, Any]], iteration: int, scale: float, kind: str, node_key: str = "node") -> list[Op]:
    return [
        Op(int(r[node_key]), int(r.get("mb", -1)), r.get("kind", kind), r["start"] / scale, r["end"] / scale)
        for r in records
        if r["type"] == kind and r["it"] == iteration and "start" in r
    ]


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
    measured = GanttPanel(
        ops=_spans(records, iteration, scale, "op"),
        title=f"measured (iteration {iteration + 1})",
        waits=_spans(records, iteration, scale, "wait"),
        transfers=_spans(records, iteration, scale, "transfer", node_key="dst"),
    )
    panels = [measured]
    if predicted is not None:
        label = "simulated" + (f" (makespan {predicted_makespan:.1f} s)" if predicted_makespan else "")
        panels.append(GanttPanel(ops=predicted, title=label))
    xlabel = "plan seconds" + (f" (real seconds / {scale:g})" if scale != 1.0 else "")
    return gantt_panels(panels, path, nodes=range(n_nodes), title=title or None, xlabel=xlabel)
