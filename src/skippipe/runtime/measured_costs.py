"""Costs for a re-plan from what the workers measured, not from what the plan assumed.

Every worker keeps its timeline records (``worker.py``): each operation's start and end, and each
message it received with the sender's send time (``sent_at``, the sender's wall clock when it
handed the message over) and the time its payload was here (``arrived_at``). When the launcher
drains a round (a drift, ``adapt.py``), each worker writes them, with the run's time scale and
the first iteration of its round, to ``RUN/elastic/round-K/measured/node-NNN.json``
(``write_measurements``, called beside the stage handoff).

``measure`` keeps the last ``window`` iterations every node finished, from the drift's first
iteration on (the first iteration of a round pays for the restart and is left out; when the
drain came before every node finished one of them, those some node finished) and estimates,
in plan seconds (real seconds / ``time_scale``):

- per directed link ``src -> dst`` that carried a message: the hop time, the median over those
  iterations of ``arrived_at - sent_at`` (the emulated or real delay plus the sender's and the
  receiver's overhead: what a hop costs the pipeline);
- per node: the median forward and backward operation times.

``measured_costs`` builds the re-plan's matrices from them: a measured link's hop time replaces
the plan's (both directions where only one was observed is NOT assumed: each direction keeps its
own figure, the plan's when unobserved); a node's ``forward_s`` becomes ``(F + B) / (1 +
backward_factor)`` (the cost model has one backward factor for all nodes, so the node's measured
forward+backward time is kept whole), or ``F`` alone / ``B / backward_factor`` when only one was
seen. Links and nodes nothing was observed on keep the plan's figures. Medians make one late
message (a GC pause, a busy core) not move the estimate.

Sender and receiver clocks: on one machine (emulation) they are the same clock; across machines
``arrived_at - sent_at`` includes their offset, so the hop estimates are only as good as the
hosts' clock synchronisation (NTP: typically well under a millisecond on a LAN, a few ms over a
WAN). Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from skippipe.fileio import atomic_write_text

FOLDER = "measured"


@dataclass(frozen=True)
class NodeRecords:
    node: int
    time_scale: float
    first_iteration: int  # 0-based: the first iteration this worker ran in its round
    records: list[dict[str, Any]]


@dataclass
class Measured:
    """Medians in plan seconds, and the iterations (0-based) they were taken over."""

    iterations: list[int] = field(default_factory=list)
    hop_s: dict[tuple[int, int], float] = field(default_factory=dict)
    hop_count: dict[tuple[int, int], int] = field(default_factory=dict)
    forward_s: dict[int, float] = field(default_factory=dict)
    backward_s: dict[int, float] = field(default_factory=dict)


def write_measurements(folder: Path, node: int, time_scale: float, first_iteration: int,
                       records: list[dict[str, Any]]) -> Path:
    """One worker's records, under ``folder/measured`` (``folder``: its round's handoff folder)."""
    path = folder / FOLDER / f"node-{node:03d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"node": node, "time_scale": time_scale, "first_iteration": first_iteration, "records": records}
    atomic_write_text(path, json.dumps(doc) + "\n")
    return path


def load_measurements(folder: Path) -> list[NodeRecords]:
    """The workers' records written under ``folder/measured`` (unreadable files are skipped)."""
    out = []
    for f in sorted((folder / FOLDER).glob("node-*.json")):
        try:
            doc = json.loads(f.read_text())
            out.append(NodeRecords(int(doc["node"]), float(doc["time_scale"]), int(doc["first_iteration"]),
                                   list(doc["records"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def usable_iterations(nodes: list[NodeRecords], window: int, since: int = 0) -> list[int]:
    """The last ``window`` iterations from ``since`` on that every node finished, a round's first
    iteration left out; when no node finished all of one, those some node finished (their
    records are as good, there are only fewer of them)."""
    if not nodes or window <= 0:
        return []
    finished = [{int(r["it"]) for r in n.records if r.get("type") == "iteration" and int(r["it"]) > n.first_iteration
                 and int(r["it"]) >= since} for n in nodes]
    done = set.intersection(*finished) or set.union(*finished)
    return sorted(done)[-window:]


def measure(nodes: list[NodeRecords], window: int, since: int = 0) -> Measured:
    """Median hop and operation times (plan seconds) over the last ``window`` complete iterations
    from iteration ``since`` (0-based, as in the records) on: a drift's first iteration, the costs
    before it are not the ones to plan with."""
    its = usable_iterations(nodes, window, since)
    wanted = set(its)
    hops: dict[tuple[int, int], list[float]] = {}
    ops: dict[tuple[int, str], list[float]] = {}
    for n in nodes:
        scale = n.time_scale if n.time_scale > 0 else 1.0
        for r in n.records:
            if int(r.get("it", -1)) not in wanted or "start" not in r or "end" not in r:
                continue
            span = (float(r["end"]) - float(r["start"])) / scale
            if r["type"] == "transfer":
                hops.setdefault((int(r["src"]), int(r["dst"])), []).append(span)
            elif r["type"] == "op" and r.get("kind") in ("F", "B"):
                ops.setdefault((int(r["node"]), str(r["kind"])), []).append(span)
    m = Measured(iterations=its)
    for key, spans in hops.items():
        m.hop_s[key] = float(np.median(spans))
        m.hop_count[key] = len(spans)
    for (node, kind), spans in ops.items():
        (m.forward_s if kind == "F" else m.backward_s)[node] = float(np.median(spans))
    return m


def measured_costs(transfer_s: np.ndarray, forward_s: np.ndarray, backward_factor: float,
                   m: Measured) -> tuple[np.ndarray, np.ndarray]:
    """The plan's ``transfer_s`` and ``forward_s`` with the measured links and nodes put in (the
    others keep the plan's figures)."""
    transfer = np.array(transfer_s, dtype=float)
    forward = np.array(forward_s, dtype=float)
    n = forward.shape[0]
    for (a, b), hop in m.hop_s.items():
        if 0 <= a < n and 0 <= b < n and a != b:
            transfer[a, b] = hop
    for node in set(m.forward_s) | set(m.backward_s):
        if not 0 <= node < n:
            continue
        f, b = m.forward_s.get(node), m.backward_s.get(node)
        if f is not None and b is not None:
            forward[node] = (f + b) / (1.0 + backward_factor)
        elif f is not None:
            forward[node] = f
        elif b is not None and backward_factor > 0:
            forward[node] = b / backward_factor
    return transfer, forward


def describe(m: Measured, transfer_s: np.ndarray, measured: np.ndarray) -> str:
    """One line: how many links and nodes were measured, and the link that changed most."""
    if not m.hop_s:
        return "nothing measured: the plan's costs were kept"
    a, b = max(m.hop_s, key=lambda k: measured[k] / max(float(transfer_s[k]), 1e-12))
    nodes = len(set(m.forward_s) | set(m.backward_s))
    its = f"iterations {m.iterations[0] + 1}..{m.iterations[-1] + 1}" if m.iterations else "no iteration"
    return (f"measured {len(m.hop_s)} link(s) and {nodes} node(s) over {its}; link {a}->{b}: "
            f"{float(transfer_s[a, b]):.3f} s planned, {float(measured[a, b]):.3f} s measured")
