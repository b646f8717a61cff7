"""The plan file: a versioned JSON document that any tool can read.

Core keys (stable across versions):

- ``version`` (int, 2; version-1 files load when their paths obey the version-2 jump rule),
  ``format`` ("skippipe-plan")
- ``stages``: list of lists of node ids, pipeline order; stage 0 are the data nodes
- ``layers``: model layer ids held by each stage (every layer in exactly one stage)
- ``memory``: activation slots per node (an int for all, or one per node)
- ``constraints``: ``path_length`` (L, stage 0 included), ``max_swaps``, ``max_jump`` (a visit
  above the frontier, the highest stage reached so far, is at most ``max_jump`` stages past it),
  ``max_load`` (per-node cap on microbatches handled per iteration, TC1; null = no cap)
- ``costs``: ``transfer_s`` (N x N seconds per microbatch hop), ``forward_s`` (per node, one
  stage, one microbatch), ``backward_factor``, ``loss_factor``, ``inject_gap_s``, ``op_gap_s``
- ``microbatches``: list of ``{id, data_node, path, release_s, after}``; ``path`` is the node ids
  visited after leaving the data node, in forward order, without the return to the data node.
  ``after`` (optional) is a microbatch id whose backward must finish before this one is injected.

Optional: ``processing_order`` (node -> list of operations such as ``"F3"``, ``"L3"``, ``"B3"``,
performed in exactly that order), ``method``, ``seed``, ``workload``, ``model``, ``nodes``,
``predicted_makespan_s``, ``lower_bound_s``, ``meta``, ``frozen_stages`` (stages with no node
left after a failure: no path visits them, their weights stay frozen; see ``validate.py``).

Operations on a microbatch: ``F`` forward of the node's stage (on the data node: embedding +
stage-0 layers, the injection), ``L`` final norm + head + loss on the data node, ``B`` backward
of the node's stage. Everything here is torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from skippipe.costs import BACKWARD_FACTOR, INJECT_GAP_S, LOSS_FACTOR, OP_GAP_S, OpCostRule
from skippipe.errors import PlanError
from skippipe.limits import FLOAT_LIMIT, INT_LIMIT

PLAN_FORMAT = "skippipe-plan"
# version 2: ``max_jump`` bounds how far past the frontier a visit may go (s - frontier <=
# max_jump); version 1 files meant stages skipped at once (s - frontier - 1 <= max_jump). A
# version-1 file still loads when its paths obey the version-2 rule.
PLAN_VERSION = 2
OP_KINDS = ("F", "L", "B")


@dataclass
class Constraints:
    path_length: int
    max_swaps: int = 1
    max_jump: int = 4
    max_load: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path_length": self.path_length,
            "max_swaps": self.max_swaps,
            "max_jump": self.max_jump,
            "max_load": None if self.max_load is None else [int(x) for x in self.max_load],
        }


@dataclass
class Costs(OpCostRule):
    transfer_s: np.ndarray  # N x N
    forward_s: np.ndarray  # N
    backward_factor: float = BACKWARD_FACTOR
    loss_factor: float = LOSS_FACTOR
    inject_gap_s: float = INJECT_GAP_S
    op_gap_s: float = OP_GAP_S

    @property
    def n(self) -> int:
        return int(self.forward_s.shape[0])

    def op_s(self, node: int, kind: str) -> float:
        """Seconds of one operation ``F``, ``L`` or ``B`` on ``node``."""
        return float(self.forward_s[node]) * self.op_factor(kind)

    def gap_s(self, injection: bool) -> float:
        """Idle seconds after an operation (after an injection: ``inject_gap_s``)."""
        return self.inject_gap_s if injection else self.op_gap_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "transfer_s": np.asarray(self.transfer_s, dtype=float).tolist(),
            "forward_s": np.asarray(self.forward_s, dtype=float).tolist(),
            "backward_factor": float(self.backward_factor),
            "loss_factor": float(self.loss_factor),
            "inject_gap_s": float(self.inject_gap_s),
            "op_gap_s": float(self.op_gap_s),
        }


@dataclass
class Microbatch:
    id: int
    data_node: int
    path: list[int]
    release_s: float = 0.0
    after: int | None = None

    def route(self) -> list[int]:
        """The full forward route: data node, path nodes, data node again."""
        return [self.data_node, *self.path, self.data_node]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "data_node": self.data_node, "path": list(self.path)}
        if self.release_s:
            d["release_s"] = float(self.release_s)
        if self.after is not None:
            d["after"] = int(self.after)
        return d


@dataclass
class Plan:
    stages: list[list[int]]
    layers: list[list[int]]
    memory: list[int]
    constraints: Constraints
    costs: Costs
    microbatches: list[Microbatch]
    method: str = "custom"
    seed: int | None = None
    processing_order: dict[int, list[str]] | None = None
    workload: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    nodes: list[dict[str, Any]] | None = None
    predicted_makespan_s: float | None = None
    lower_bound_s: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = PLAN_VERSION
    # stages left with no node (elastic recovery): kept in the layer layout, visited by no path,
    # their weights frozen; CC3 distances count live stages only (``validate.live_index``)
    frozen_stages: list[int] = field(default_factory=list)

    # ------------------------------------------------------------------ derived views
    @property
    def n_nodes(self) -> int:
        return self.costs.n

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def data_nodes(self) -> list[int]:
        return list(self.stages[0])

    def stage_of(self) -> dict[int, int]:
        """node id -> stage index (nodes in no stage are absent)."""
        return {node: s for s, nodes in enumerate(self.stages) for node in nodes}

    def microbatch(self, mb_id: int) -> Microbatch:
        for mb in self.microbatches:
            if mb.id == mb_id:
                return mb
        raise KeyError(mb_id)

    def load_per_node(self) -> list[int]:
        """Microbatches each node handles in one iteration (data nodes: the ones they own)."""
        load = [0] * self.n_nodes
        for mb in self.microbatches:
            load[mb.data_node] += 1
            for node in mb.path:
                load[node] += 1
        return load

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        uniform = len(set(self.memory)) == 1
        d: dict[str, Any] = {
            "format": PLAN_FORMAT,
            "version": self.version,
            "method": self.method,
            "seed": self.seed,
            "stages": [[int(x) for x in s] for s in self.stages],
            "layers": [[int(x) for x in s] for s in self.layers],
            "memory": int(self.memory[0]) if uniform else [int(x) for x in self.memory],
            "constraints": self.constraints.to_dict(),
            "costs": self.costs.to_dict(),
            "microbatches": [mb.to_dict() for mb in self.microbatches],
        }
        if self.processing_order is not None:
            d["processing_order"] = {str(k): list(v) for k, v in sorted(self.processing_order.items())}
        for key in ("workload", "model", "nodes", "predicted_makespan_s", "lower_bound_s"):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        if self.frozen_stages:
            d["frozen_stages"] = sorted(int(s) for s in self.frozen_stages)
        if self.meta:
            d["meta"] = self.meta
        return d

    @classmethod
    def from_dict(cls, data: Any, where: str = "plan") -> Plan:
        return _plan_from_dict(data, where)


# ---------------------------------------------------------------------- parsing helpers


def _req(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise PlanError(f"{where}: missing required key {key!r}")
    return d[key]


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise PlanError(f"{where}: frozen_stages must be a list of stage indices")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{what} must be an integer, got {value!r}")
    if abs(value) > INT_LIMIT:
        raise PlanError(f"{what} is too large: {value} (the limit is 2**31)")
    return value


def _num(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PlanError(f"{what} must be a finite number, got {value!r}")
    if abs(value) > FLOAT_LIMIT:
        raise PlanError(f"{what} is too large: {value:g} (the limit is {FLOAT_LIMIT:g})")
    return float(value)


def _int_lists(value: Any, what: str) -> list[list[int]]:
    if not isinstance(value, list) or not all(isinstance(s, list) for s in value):
        raise PlanError(f"{what} must be a list of lists of integers")
    return [[_int(x, f"{what}[{i}] entries") for x in s] for i, s in enumerate(value)]


def _plan_from_dict(data: Any, where: str) -> Plan:
    if not isinstance(data, dict):
        raise PlanError(f"{where}: a plan must be a JSON object")
    if "format" not in data and "version" not in data:
        raise PlanError(f"{where}: not a plan file (it has no format {PLAN_FORMAT!r}): write one with `skippipe plan`")
    fmt = data.get("format", PLAN_FORMAT)
    if fmt != PLAN_FORMAT:
        raise PlanError(f"{where}: format is {fmt!r}, expected {PLAN_FORMAT!r}")
    version = _int(_req(data, "version", where), f"{where}: version")
    if version > PLAN_VERSION or version < 1:
        raise PlanError(f"{where}: plan version {version} is not supported (this skippipe reads version {PLAN_VERSION})")

    costs_d = _req(data, "costs", where)
    if not isinstance(costs_d, dict):
        raise PlanError(f"{where}: costs must be an object")
    try:
        transfer = np.array(_req(costs_d, "transfer_s", f"{where}: costs"), dtype=float)
        forward = np.array(_req(costs_d, "forward_s", f"{where}: costs"), dtype=float)
    except (TypeError, ValueError):
        raise PlanError(f"{where}: costs.transfer_s and costs.forward_s must hold numbers") from None
    if forward.ndim != 1 or forward.size < 1:
        raise PlanError(f"{where}: costs.forward_s must be a list with one number per node")
    n = forward.shape[0]
    if transfer.ndim != 2 or transfer.shape != (n, n):
        raise PlanError(
            f"{where}: costs.transfer_s must be a {n} x {n} matrix (one row per node), got shape {list(transfer.shape)}"
        )
    if not np.all(np.isfinite(transfer)) or np.any(transfer < 0):
        raise PlanError(f"{where}: costs.transfer_s must hold finite non-negative seconds")
    if not np.all(np.isfinite(forward)) or np.any(forward <= 0):
        raise PlanError(f"{where}: costs.forward_s must hold positive seconds")
    if max(transfer.max(), forward.max()) > FLOAT_LIMIT:
        raise PlanError(f"{where}: costs hold seconds above the limit of {FLOAT_LIMIT:g}")
    costs = Costs(
        transfer_s=transfer,
        forward_s=forward,
        backward_factor=_num(costs_d.get("backward_factor", BACKWARD_FACTOR), f"{where}: costs.backward_factor"),
        loss_factor=_num(costs_d.get("loss_factor", LOSS_FACTOR), f"{where}: costs.loss_factor"),
        inject_gap_s=_num(costs_d.get("inject_gap_s", INJECT_GAP_S), f"{where}: costs.inject_gap_s"),
        op_gap_s=_num(costs_d.get("op_gap_s", OP_GAP_S), f"{where}: costs.op_gap_s"),
    )

    stages = _int_lists(_req(data, "stages", where), f"{where}: stages")
    layers = _int_lists(_req(data, "layers", where), f"{where}: layers")

    memory_raw = _req(data, "memory", where)
    if isinstance(memory_raw, list):
        memory = [_int(x, f"{where}: memory entries") for x in memory_raw]
        if len(memory) != n:
            raise PlanError(f"{where}: memory has {len(memory)} entries for {n} nodes")
    else:
        memory = [_int(memory_raw, f"{where}: memory")] * n

    cons_d = _req(data, "constraints", where)
    if not isinstance(cons_d, dict):
        raise PlanError(f"{where}: constraints must be an object")
    max_load_raw = cons_d.get("max_load")
    max_load = None
    if max_load_raw is not None:
        if not isinstance(max_load_raw, list) or len(max_load_raw) != n:
            raise PlanError(f"{where}: constraints.max_load must list one integer per node ({n})")
        max_load = [_int(x, f"{where}: constraints.max_load entries") for x in max_load_raw]
    constraints = Constraints(
        path_length=_int(_req(cons_d, "path_length", f"{where}: constraints"), f"{where}: constraints.path_length"),
        max_swaps=_int(cons_d.get("max_swaps", 1), f"{where}: constraints.max_swaps"),
        max_jump=_int(cons_d.get("max_jump", 4), f"{where}: constraints.max_jump"),
        max_load=max_load,
    )

    mbs_raw = _req(data, "microbatches", where)
    if not isinstance(mbs_raw, list):
        raise PlanError(f"{where}: microbatches must be a list")
    microbatches = []
    for i, m in enumerate(mbs_raw):
        w = f"{where}: microbatches[{i}]"
        if not isinstance(m, dict):
            raise PlanError(f"{w} must be an object")
        path = _req(m, "path", w)
        if not isinstance(path, list):
            raise PlanError(f"{w}.path must be a list of node ids")
        after = m.get("after")
        microbatches.append(
            Microbatch(
                id=_int(_req(m, "id", w), f"{w}.id"),
                data_node=_int(_req(m, "data_node", w), f"{w}.data_node"),
                path=[_int(x, f"{w}.path entries") for x in path],
                release_s=_num(m.get("release_s", 0.0), f"{w}.release_s"),
                after=None if after is None else _int(after, f"{w}.after"),
            )
        )

    order = None
    if data.get("processing_order") is not None:
        raw = data["processing_order"]
        if not isinstance(raw, dict):
            raise PlanError(f"{where}: processing_order must map node ids to lists of operations")
        order = {}
        for key, ops in raw.items():
            try:
                node = int(key)
            except ValueError:
                raise PlanError(f"{where}: processing_order key {key!r} is not a node id") from None
            if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
                raise PlanError(f"{where}: processing_order[{key}] must be a list of strings like 'F3'")
            order[node] = list(ops)

    def opt_num(key: str) -> float | None:
        v = data.get(key)
        return None if v is None else _num(v, f"{where}: {key}")

    seed = data.get("seed")
    return Plan(
        stages=stages,
        layers=layers,
        memory=memory,
        constraints=constraints,
        costs=costs,
        microbatches=microbatches,
        method=str(data.get("method", "custom")),
        seed=None if seed is None else _int(seed, f"{where}: seed"),
        processing_order=order,
        workload=data.get("workload"),
        model=data.get("model"),
        nodes=data.get("nodes"),
        predicted_makespan_s=opt_num("predicted_makespan_s"),
        lower_bound_s=opt_num("lower_bound_s"),
        meta=dict(data.get("meta") or {}),
        version=version,
        frozen_stages=[_int(x, f"{where}: frozen_stages entries") for x in _list(data.get("frozen_stages", []), where)],
    )


def parse_op(token: str) -> tuple[str, int]:
    """``"F12"`` -> ``("F", 12)``."""
    if len(token) < 2 or token[0] not in OP_KINDS or not token[1:].isdigit():
        raise PlanError(f"operation {token!r} is not of the form F<id>, L<id> or B<id>")
    return token[0], int(token[1:])
