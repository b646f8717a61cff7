"""Charts as PNG files (matplotlib, Agg backend): a Gantt chart of one iteration and bar charts.

The Gantt chart takes any sequence of records with ``node``, ``mb``, ``kind`` ('F', 'L', 'B'),
``start`` and ``end`` - the ``OpRecord`` list of a simulation or a timeline measured by the
runtime. matplotlib is imported only when a chart is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from skippipe.errors import UserError
from skippipe.fileio import atomic_write

KIND_COLORS = {"F": "#4C72B0", "L": "#DD8452", "B": "#55A868"}
KIND_NAMES = {"F": "forward", "L": "head + loss", "B": "backward"}


class _Op(Protocol):
    node: int
    mb: int
    kind: str
    start: float
    end: float


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: str | Path, dpi: float | None = None) -> Path:
    """Write the figure as a PNG, atomically (``fileio.atomic_write``)."""
    p = Path(path)
    if p.suffix.lower() != ".png":
        raise UserError(f"{p}: charts are written as PNG; give a file name ending in .png")
    atomic_write(p, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi or fig.dpi, bbox_inches="tight"))
    return p


WAIT_COLOR = "#DDDDDD"
TRANSFER_COLOR = "#8172B3"


@dataclass
class GanttPanel:
    """One timeline: operations, and optionally waits (on ``node``) and transfers (into ``node``)."""

    ops: Sequence[_Op]
    title: str | None = None
    makespan_s: float | None = None
    lower_bound_s: float | None = None
    waits: Sequence[_Op] = ()
    transfers: Sequence[_Op] = ()


def gantt(
    ops: Sequence[_Op],
    path: str | Path,
    stages: Sequence[Sequence[int]] | None = None,
    title: str | None = None,
    makespan_s: float | None = None,
    lower_bound_s: float | None = None,
    label_min_s: float | None = None,
) -> Path:
    """One row per node (grouped by stage, stage 0 on top), one bar per operation.

    Bars are coloured by kind (forward, head + loss, backward) and labelled with the microbatch
    id where they are wide enough; dashed lines mark the makespan and the lower bound.
    """
    panel = GanttPanel(ops, makespan_s=makespan_s, lower_bound_s=lower_bound_s)
    return gantt_panels([panel], path, stages=stages, title=title, label_min_s=label_min_s)


def gantt_panels(
    panels: Sequence[GanttPanel],
    path: str | Path,
    stages: Sequence[Sequence[int]] | None = None,
    title: str | None = None,
    label_min_s: float | None = None,
    xlabel: str = "seconds",
    nodes: Sequence[int] | None = None,
) -> Path:
    """Several timelines of the same nodes stacked on one time axis (e.g. measured over simulated).
    Rows: the nodes of ``stages`` grouped by stage, else ``nodes``, else every node seen."""
    plt = _pyplot()
    if stages is None:
        rows = list(nodes) if nodes is not None else sorted({op.node for panel in panels for op in panel.ops})
        labels = [f"node {x}" for x in rows]
    else:
        rows = [x for s in stages for x in s]
        labels = [f"S{si} · node {x}" for si, s in enumerate(stages) for x in s]
    row_of = {x: i for i, x in enumerate(rows)}
    end = max(
        [op.end for panel in panels for op in (*panel.ops, *panel.waits, *panel.transfers)]
        + [max(panel.makespan_s or 0.0, panel.lower_bound_s or 0.0) for panel in panels]
        + [1e-9]
    )
    label_min = label_min_s if label_min_s is not None else end / 90
    height = max(3.0, 0.32 * len(rows) + 1.2)
    fig, axes = plt.subplots(len(panels), 1, figsize=(14, height * len(panels)), dpi=110, sharex=True, squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        _draw_panel(ax, panel, row_of, label_min)
        if stages is not None:
            edge = 0
            for s in stages[:-1]:
                edge += len(s)
                ax.axhline(edge - 0.5, color="#999999", linewidth=0.6)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xlim(0, end * 1.02)
        ax.grid(axis="x", color="#dddddd", linewidth=0.5)
        ax.set_axisbelow(True)
        if panel.title:
            ax.set_title(panel.title, fontsize=10, loc="left")
    last = axes[-1, 0]
    last.set_xlabel(xlabel)
    if title and len(panels) == 1:
        axes[0, 0].set_title(title)
    elif title:
        fig.suptitle(title, x=0.01, ha="left")
    handles: dict[str, Any] = {}
    for ax in axes[:, 0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if len(panels) == 1:
        last.legend(
            handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=7, fontsize=8, frameon=False
        )
    else:
        fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=7, fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.03, 1, 1))
    try:
        return save_png(fig, path)
    finally:
        plt.close(fig)


def _draw_panel(ax: Any, panel: GanttPanel, row_of: Mapping[int, int], label_min: float) -> None:
    waits = [(row_of[w.node], w.start, w.end - w.start) for w in panel.waits if w.node in row_of]
    for y, x, w in waits:
        ax.broken_barh([(x, w)], (y - 0.12, 0.24), facecolors=WAIT_COLOR)
    for tr in panel.transfers:
        if tr.node in row_of:
            y = row_of[tr.node]
            ax.broken_barh([(tr.start, tr.end - tr.start)], (y + 0.3, 0.12), facecolors=TRANSFER_COLOR, alpha=0.6)
    spans: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for op in panel.ops:
        if op.node in row_of:
            spans.setdefault((op.kind, row_of[op.node]), []).append((op.start, op.end - op.start))
    for (kind, y), xs in spans.items():
        ax.broken_barh(xs, (y - 0.4, 0.8), facecolors=KIND_COLORS.get(kind, TRANSFER_COLOR), edgecolors="white", linewidth=0.4)
    for kind, color in KIND_COLORS.items():
        ax.bar(0, 0, color=color, label=KIND_NAMES[kind])  # legend entry
    if waits:
        ax.bar(0, 0, color=WAIT_COLOR, label="waiting")
    if panel.transfers:
        ax.bar(0, 0, color=TRANSFER_COLOR, label="transfer (to this node)")
    for op in panel.ops:
        if op.node in row_of and op.end - op.start >= label_min:
            ax.text((op.start + op.end) / 2, row_of[op.node], str(op.mb), ha="center", va="center", fontsize=6, color="white")
    if panel.makespan_s is not None:
        ax.axvline(panel.makespan_s, color="#C44E52", linestyle="--", linewidth=1.2, label=f"makespan {panel.makespan_s:.2f} s")
    if panel.lower_bound_s is not None and panel.lower_bound_s > 0:
        label = f"lower bound {panel.lower_bound_s:.2f} s"
        ax.axvline(panel.lower_bound_s, color="#555555", linestyle=":", linewidth=1.2, label=label)


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    path: str | Path,
    title: str | None = None,
    ylabel: str = "seconds per iteration",
    lines: Mapping[str, float] | None = None,
    colors: Sequence[str] | None = None,
    value_format: str = "{:.1f}",
) -> Path:
    """Vertical bars with their values printed on top; ``lines`` adds labelled horizontal lines
    (e.g. a lower bound). Non-finite values are drawn as empty bars marked 'n/a'."""
    import math

    plt = _pyplot()
    if len(labels) != len(values):
        raise ValueError("bar_chart: labels and values differ in length")
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(labels) + 2), 4.2), dpi=110)
    finite = [v if math.isfinite(v) else 0.0 for v in values]
    bars = ax.bar(range(len(labels)), finite, color=list(colors) if colors else "#4C72B0")
    top = max(finite + list((lines or {}).values()) + [1e-9])
    for bar, v in zip(bars, values):
        text = value_format.format(v) if math.isfinite(v) else "n/a"
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + top * 0.01, text, ha="center", va="bottom", fontsize=8)
    for i, (name, y) in enumerate((lines or {}).items()):
        colour = ("#C44E52", "#555555", "#8172B3")[i % 3]
        ax.axhline(y, color=colour, linestyle="--", linewidth=1, label=f"{name} {value_format.format(y)}")
    if lines:
        ax.legend(fontsize=8, frameon=False)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, top * 1.12)
    if title:
        ax.set_title(title)
    try:
        return save_png(fig, path)
    finally:
        plt.close(fig)
