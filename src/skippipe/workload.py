"""What is trained: stages, path length (skip ratio), microbatches, memory, model shape.

Defaults are the reference configuration (DESIGN §3): 6 stages, paths of 4 stages (33 % skip),
6 microbatches of 8 samples per data node, memory 3, a LLaMA-500M-like layout.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from skippipe.config_fields import check_fields, invalid, read_dataclass
from skippipe.costs import WireFormat
from skippipe.errors import WorkloadError
from skippipe.limits import MAX_CTX, MAX_LAYERS, MAX_MICROBATCHES, MAX_NODES, MAX_SAMPLES, MAX_STAGES, MAX_WIDTH, at_most

NON_NEGATIVE = {"min": 0}

# whether stages 1..S-1 with these TC1 cap sums can take this many microbatches under the path
# rules (``planner.problem`` gives one; without it each stage counts up to one visit a microbatch)
StageCapsCarry = Callable[[list[int], int], bool]
# stage sizes tried per number of data nodes (the nodes left over on other stages), and how many
# of them the path rules are asked about (an integer programme each, about 2 ms); beyond that
# the count of one visit per microbatch a stage decides
SPLITS_PER_D = 16
PATH_RULE_CHECKS = 64


def tc1_caps(speed: np.ndarray | Sequence[float], visits: int, total_speed: float) -> np.ndarray:
    """The TC1 rule: nodes of these speeds get ``visits`` in proportion to their share of
    ``total_speed`` (the speed of every node outside stage 0), rounded up, at least 1."""
    return np.maximum(1.0, np.ceil(visits * np.asarray(speed, dtype=float) / total_speed - 1e-9))


def largest_tc1_caps(speed: np.ndarray | Sequence[float], visits: int, data_nodes: int) -> np.ndarray:
    """Each node's TC1 cap at its largest over every choice of the ``data_nodes`` stage-0 nodes:
    with the fastest in stage 0 the others' speed, which the visits are shared by, is least;
    infinite where no speed is left to share."""
    speed = np.asarray(speed, dtype=float)
    others = float(speed.sum() - np.sort(speed)[::-1][:data_nodes].sum())
    if not (math.isfinite(others) and others > 1e-12):
        return np.full(len(speed), np.inf)
    return tc1_caps(speed, visits, others)


def least_max_jump(num_stages: int, path_length: int) -> int:
    """The least ``max_jump`` with which some path reaches the last stage: each of the L - 1
    visits moves the frontier at most ``max_jump`` stages, so it must be at least
    ceil((S - 1) / (L - 1)); from there every stage lies on some valid path."""
    return -(-(num_stages - 1) // max(1, path_length - 1))


@dataclass(frozen=True)
class PipelineShape:
    """The pipeline a plan lays out: stages, path length, microbatches, memory, path rules.

    The keys of ``[plan]`` in a ``skippipe train`` config; ``Workload`` adds the model's size.
    """

    config_label: ClassVar[str] = "workload"
    config_error: ClassVar[type[WorkloadError]] = WorkloadError

    num_stages: int = field(default=6, metadata=at_most(MAX_STAGES, min=2))
    path_length: int = 4  # stages each microbatch visits, stage 0 included
    microbatches_per_data_node: int = field(default=6, metadata=at_most(MAX_MICROBATCHES, min=1))
    memory: int = field(default=3, metadata={"min": 1})  # activation slots per node, unless the cluster says otherwise
    max_swaps: int = field(default=1, metadata=NON_NEGATIVE)
    max_jump: int = field(default=4, metadata=NON_NEGATIVE)  # a visit goes at most this many stages past the highest reached
    # nodes per stage; derived from the cluster's size when None
    stage_sizes: tuple[int, ...] | None = field(default=None, metadata=at_most(MAX_NODES, min=1, max_len=MAX_STAGES))

    def __post_init__(self) -> None:
        check_fields(self)
        if not 2 <= self.path_length <= self.num_stages:
            raise invalid(
                self, "path_length",
                f"path_length L={self.path_length} must be between 2 and the number of stages S={self.num_stages}",
            )
        need = least_max_jump(self.num_stages, self.path_length)
        if self.max_jump < need:
            reach, top = self.max_jump * (self.path_length - 1), self.num_stages - 1
            unreached = f"stage {top}" if reach + 1 == top else f"stages {reach + 1}..{top}"
            raise invalid(
                self, "max_jump",
                f"with max_jump={self.max_jump} and path_length L={self.path_length} no path gets past stage {reach}, "
                f"so {unreached} would never be trained: use max_jump >= {need}",
            )
        if self.stage_sizes is not None and len(self.stage_sizes) != self.num_stages:
            raise invalid(
                self, "stage_sizes", f"stage_sizes has {len(self.stage_sizes)} entries for {self.num_stages} stages"
            )

    def with_model(
        self, n_layers: int, d_model: int, ctx: int, samples_per_microbatch: int, wire_format: WireFormat = "fp32"
    ) -> Workload:
        """This pipeline for a model of ``n_layers`` layers, ``d_model`` wide, ``ctx`` tokens, whose
        activations travel in ``wire_format``."""
        shape = {f.name: getattr(self, f.name) for f in fields(PipelineShape)}
        return Workload(
            **shape, n_layers=n_layers, d_model=d_model, ctx=ctx, samples_per_microbatch=samples_per_microbatch,
            wire_format=wire_format,
        )


@dataclass(frozen=True)
class Workload(PipelineShape):
    """A pipeline shape and the model it carries (activation size, layers per stage)."""

    samples_per_microbatch: int = field(default=8, metadata=at_most(MAX_SAMPLES, min=1))
    d_model: int = field(default=1024, metadata=at_most(MAX_WIDTH, min=1))
    ctx: int = field(default=1024, metadata=at_most(MAX_CTX, min=1))
    n_layers: int = field(default=24, metadata=at_most(MAX_LAYERS, min=1))
    wire_format: WireFormat = "fp32"  # activations/gradients on the wire: bytes per value (skippipe.costs)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_layers < self.num_stages:
            raise invalid(self, "n_layers", f"{self.n_layers} layers cannot fill {self.num_stages} stages")

    def layers_per_stage(self) -> list[int]:
        """Contiguous layer counts per stage, as even as possible (earlier stages get the rest)."""
        base, extra = divmod(self.n_layers, self.num_stages)
        return [base + (1 if i < extra else 0) for i in range(self.num_stages)]

    def layer_ranges(self) -> list[list[int]]:
        out, start = [], 0
        for count in self.layers_per_stage():
            out.append(list(range(start, start + count)))
            start += count
        return out

    def sizes_for(
        self, n_nodes: int, speeds: Sequence[float] | None = None, carries: StageCapsCarry | None = None
    ) -> list[int]:
        """Nodes per stage for a cluster of n nodes (``speeds``: theirs, 1 / forward time; all
        equal when not given).

        Every node should carry the same load: a data node runs its m microbatches; the
        D*m*(L-1) visits to other stages spread over the other nodes. Equal load gives
        D = N / L data nodes; the rest split evenly over stages 1..S-1 (the nodes left over to
        the earlier stages). Where the stages could not take the visits under the TC1 caps
        (``_carried``; ``carries`` says whether the path rules let stage cap sums take them:
        with ``max_jump`` binding the stages are not visited alike), the same D with the nodes
        left over on other stages, else the nearest D whose stages can.
        """
        if self.stage_sizes is not None:
            if sum(self.stage_sizes) != n_nodes:
                raise invalid(
                    self, "stage_sizes", f"stage_sizes add up to {sum(self.stage_sizes)} nodes but the cluster has {n_nodes}"
                )
            return list(self.stage_sizes)
        s = self.num_stages
        if n_nodes < s:
            raise WorkloadError(f"a cluster of {n_nodes} nodes cannot hold {s} stages")
        ranked = sorted(speeds) if speeds is not None else [1.0] * n_nodes
        most = n_nodes - (s - 1)
        data = min(max(1, round(n_nodes / self.path_length)), most)
        nearest = sorted(range(1, most + 1), key=lambda d: (abs(d - data), d))
        tried = (sizes for d in nearest for sizes in itertools.islice(_splits(n_nodes, s, d), SPLITS_PER_D))
        return next((sizes for k, sizes in enumerate(tried)  # the path rules asked about the first ones only
                     if self._carried(sizes, ranked, carries if k < PATH_RULE_CHECKS else None)),
                    _split(n_nodes, s, data))

    def _carried(self, sizes: list[int], ranked_speeds: list[float], carries: StageCapsCarry | None = None) -> bool:
        """Whether stages of these sizes can take the D*m*(L-1) visits under the TC1 caps (each
        node outside stage 0 its share by speed, rounded up; a stage at most one visit per
        microbatch) on one allocation: the D slowest nodes as data nodes, the others dealt
        fastest first to the stage that needs the most per free place. With L = S every stage
        takes every microbatch, so with even speeds a stage one node smaller than the others
        is often too small. Then ``carries``, the path rules' check, on each stage's best cap sum."""
        microbatches = sizes[0] * self.microbatches_per_data_node
        visits = microbatches * (self.path_length - 1)
        others = ranked_speeds[sizes[0]:]
        caps = tc1_caps(others, visits, sum(others)).astype(int).tolist()
        carry, free = [0] * len(sizes[1:]), list(sizes[1:])
        for cap in reversed(caps):  # fastest first
            k = max((k for k in range(len(free)) if free[k]), key=lambda k: (microbatches - carry[k]) / free[k])
            carry[k] += cap
            free[k] -= 1
        if sum(min(c, microbatches) for c in carry) < visits:
            return False
        # the path rules, asked about each stage at its best (its nodes the fastest there are):
        # so only sizes that no dealing of the nodes could carry are turned down
        return carries is None or carries([sum(caps[len(caps) - size:]) for size in sizes[1:]], microbatches)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["stage_sizes"] is not None:
            d["stage_sizes"] = list(d["stage_sizes"])
        return d


def _split(n_nodes: int, num_stages: int, data: int) -> list[int]:
    """``data`` data nodes, the rest of ``n_nodes`` split as evenly as can be over stages 1..S-1
    (earlier stages get the rest)."""
    return next(_splits(n_nodes, num_stages, data))


def _splits(n_nodes: int, num_stages: int, data: int) -> Iterator[list[int]]:
    """``data`` data nodes, the rest of ``n_nodes`` split as evenly as can be over stages 1..S-1:
    every choice of the stages that take the nodes left over, the earliest stages first."""
    base, extra = divmod(n_nodes - data, num_stages - 1)
    for chosen in itertools.combinations(range(num_stages - 1), extra):
        yield [data] + [base + (1 if i in chosen else 0) for i in range(num_stages - 1)]


# The pipeline ``skippipe train`` plans when its ``[plan]`` table does not say: a small run.
TRAINING_SHAPE = PipelineShape(num_stages=4, path_length=3, microbatches_per_data_node=4, memory=2)


def workload_from_dict(data: dict[str, Any], where: str = "workload") -> Workload:
    """A workload from a table of a JSON/TOML file; ``WorkloadError``s name ``where`` and the key."""
    return read_dataclass(Workload, data, where)
