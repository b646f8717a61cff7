"""A planning problem: cluster + workload + cost model resolved into plain numbers.

Every planner (allocation, baselines, path scheduling) takes a ``Problem`` and returns a ``Plan``
built by ``Problem.make_plan`` so that all plans carry the same costs and metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from skippipe.cluster import Cluster
from skippipe.costs import CostModel, activation_bytes, scaled_t_layer
from skippipe.errors import ClusterError, UserError
from skippipe.limits import FLOAT_LIMIT
from skippipe.planfile import Constraints, Costs, Microbatch, Plan
from skippipe.planner.stage_orders import check_stage_orders, sequence_quotas, stage_sequences
from skippipe.workload import StageCapsCarry, Workload, tc1_caps


@dataclass
class Problem:
    cluster: Cluster
    workload: Workload
    cost_model: CostModel
    transfer_s: np.ndarray  # N x N seconds per microbatch hop
    forward_s: np.ndarray  # N seconds per stage forward of one microbatch
    memory: np.ndarray  # N activation slots
    stage_sizes: list[int]

    @property
    def n(self) -> int:
        return self.cluster.n

    @property
    def num_stages(self) -> int:
        return self.workload.num_stages

    @property
    def fixed_stages(self) -> list[list[int]] | None:
        return self.cluster.stages

    @property
    def even_compute(self) -> bool:
        """Whether every node computes at the same speed."""
        return len(set(self.forward_s.tolist())) <= 1

    def costs(self) -> Costs:
        cm = self.cost_model
        return Costs(
            transfer_s=self.transfer_s.copy(),
            forward_s=self.forward_s.copy(),
            backward_factor=cm.backward_factor,
            loss_factor=cm.loss_factor,
            inject_gap_s=cm.inject_gap_s,
            op_gap_s=cm.op_gap_s,
        )

    def load_caps(self, stages: list[list[int]]) -> list[int]:
        """TC1: per-node cap on microbatches per iteration.

        Data nodes run their own m microbatches. The D*m*(L-1) visits to later stages are shared
        by the other nodes in proportion to their speed (1 / forward time), rounded up.
        """
        w = self.workload
        caps = [0] * self.n
        data = stages[0]
        for node in data:
            caps[node] = w.microbatches_per_data_node
        others = [node for s in stages[1:] for node in s]
        visits = len(data) * w.microbatches_per_data_node * (w.path_length - 1)
        for node, cap in zip(others, shared_caps(self.forward_s, others, visits)):
            caps[node] = int(cap)
        return caps

    def make_plan(
        self,
        stages: list[list[int]],
        microbatches: list[Microbatch],
        method: str,
        seed: int | None,
        path_length: int | None = None,
        max_swaps: int | None = None,
        max_load: list[int] | None = None,
        processing_order: dict[int, list[str]] | None = None,
        meta: dict | None = None,
    ) -> Plan:
        w = self.workload
        nodes = None
        if self.cluster.locations is not None:
            nodes = [{"id": i, "location": loc} for i, loc in enumerate(self.cluster.locations)]
        return Plan(
            stages=[list(map(int, s)) for s in stages],
            layers=w.layer_ranges(),
            memory=[int(x) for x in self.memory],
            constraints=Constraints(
                path_length=w.path_length if path_length is None else path_length,
                max_swaps=w.max_swaps if max_swaps is None else max_swaps,
                max_jump=w.max_jump,
                max_load=self.load_caps(stages) if max_load is None else max_load,
            ),
            costs=self.costs(),
            microbatches=microbatches,
            method=method,
            seed=seed,
            processing_order=processing_order,
            workload=w.to_dict(),
            model={"n_layers": w.n_layers, "d_model": w.d_model, "ctx": w.ctx},
            nodes=nodes,
            meta={"cluster": self.cluster.name, **(meta or {})},
        )


def shared_caps(forward_s: np.ndarray, others: Sequence[int] | np.ndarray, visits: int) -> np.ndarray:
    """TC1 caps of the nodes ``others`` (those outside stage 0): ``visits`` shared in proportion
    to speed (1 / forward time), rounded up, at least 1 (``Problem.load_caps``)."""
    speed = 1.0 / np.asarray(forward_s, dtype=float)[np.asarray(others, dtype=int)]
    return tc1_caps(speed, visits, float(speed.sum())).astype(int)


def build_problem(cluster: Cluster, workload: Workload, cost_model: CostModel | None = None) -> Problem:
    if cost_model is None:  # the cluster's (or default) constant is for the reference layer: scale by FLOPs
        t_reference = CostModel().t_layer_s if cluster.t_layer_s is None else cluster.t_layer_s
        cost_model = CostModel(t_layer_s=scaled_t_layer(t_reference, workload.d_model, workload.ctx))
    cm = cost_model
    if cluster.stages is not None:
        sizes = [len(s) for s in cluster.stages]
        if len(sizes) != workload.num_stages:
            raise UserError(
                f"cluster {cluster.name!r} fixes {len(sizes)} stages but the workload has {workload.num_stages}"
            )
        if sum(sizes) != cluster.n:
            raise UserError(f"cluster {cluster.name!r}: its stages hold {sum(sizes)} of its {cluster.n} nodes")
        if workload.stage_sizes is not None and list(workload.stage_sizes) != sizes:
            raise UserError(f"workload stage_sizes {list(workload.stage_sizes)} differ from the cluster's stages {sizes}")
    layers_per_stage = max(workload.layers_per_stage())
    nbytes = activation_bytes(workload.d_model, workload.ctx, workload.samples_per_microbatch, workload.wire_format)
    transfer = cluster.transfer_matrix(nbytes, cm.hop_overhead_s)
    forward = cluster.forward_vector(cm.t_layer_s, layers_per_stage, workload.samples_per_microbatch)
    memory = cluster.memory_vector(workload.memory)
    for name, values in (("transfer", transfer), ("forward", forward)):
        if not np.all(np.abs(values) <= FLOAT_LIMIT):  # NaN fails too
            raise ClusterError(
                f"its numbers give {name} times beyond {FLOAT_LIMIT:g} s (a bandwidth or speed too small?)", where=cluster.name
            )
    if workload.path_length > workload.num_stages:
        raise UserError(f"path length L={workload.path_length} is larger than the number of stages S={workload.num_stages}")
    check_stage_orders(workload.num_stages, workload.path_length, workload.max_swaps, workload.max_jump)
    if cluster.stages is None:
        sizes = workload.sizes_for(cluster.n, (1.0 / forward).tolist() if np.all(forward > 0) else None,
                                   _path_rules_carry(workload))
    return Problem(
        cluster=cluster, workload=workload, cost_model=cm, transfer_s=transfer,
        forward_s=forward, memory=memory, stage_sizes=sizes,
    )


def _path_rules_carry(workload: Workload) -> StageCapsCarry | None:
    """Whether stages 1..S-1 with these TC1 cap sums can take this many microbatches on the stage
    orders the workload's path rules allow (``Workload.sizes_for``). None where every increasing
    order is allowed (``max_jump`` >= S - 1): then a visit per microbatch a stage is the whole rule."""
    w = workload
    if w.max_jump >= w.num_stages - 1:
        return None
    return lambda sums, microbatches: sequence_quotas(
        stage_sequences(w.num_stages, w.path_length, w.max_swaps, w.max_jump), [0, *sums], microbatches
    ) is not None
