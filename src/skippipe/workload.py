"""What is trained: stages, path length (skip ratio), microbatches, memory, model shape.

Defaults are the reference configuration (DESIGN §3): 6 stages, paths of 4 stages (33 % skip),
6 microbatches of 8 samples per data node, memory 3, a LLaMA-500M-like layout.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from skippipe.config_fields import reject_unknown_keys, value_like
from skippipe.errors import UserError


@dataclass(frozen=True)
class Workload:
    num_stages: int = 6
    path_length: int = 4  # stages each microbatch visits, stage 0 included
    microbatches_per_data_node: int = 6
    samples_per_microbatch: int = 8
    memory: int = 3  # activation slots per node, unless the cluster says otherwise
    d_model: int = 1024
    ctx: int = 1024
    n_layers: int = 24
    max_swaps: int = 1
    max_jump: int = 4  # a visit goes at most this many stages past the highest one reached (CC3)
    stage_sizes: tuple[int, ...] | None = None  # nodes per stage; derived when None

    def __post_init__(self) -> None:
        if self.num_stages < 2:
            raise UserError(f"workload: num_stages must be at least 2, got {self.num_stages}")
        if not 2 <= self.path_length <= self.num_stages:
            raise UserError(
                f"workload: path_length L={self.path_length} must be between 2 and the number of stages S={self.num_stages}"
            )
        if self.n_layers < self.num_stages:
            raise UserError(f"workload: {self.n_layers} layers cannot fill {self.num_stages} stages")
        for name in ("microbatches_per_data_node", "samples_per_microbatch", "d_model", "ctx"):
            if getattr(self, name) < 1:
                raise UserError(f"workload: {name} must be at least 1")
        if self.memory < 1:
            raise UserError(f"workload: memory must be at least 1 microbatch, got {self.memory}")
        if self.max_swaps < 0 or self.max_jump < 0:
            raise UserError("workload: max_swaps and max_jump must be >= 0")
        if self.stage_sizes is not None:
            if len(self.stage_sizes) != self.num_stages:
                raise UserError(
                    f"workload: stage_sizes has {len(self.stage_sizes)} entries for {self.num_stages} stages"
                )
            if any(s < 1 for s in self.stage_sizes):
                raise UserError("workload: every stage needs at least one node")

    @property
    def skip_ratio(self) -> float:
        return 1.0 - self.path_length / self.num_stages

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

    def sizes_for(self, n_nodes: int) -> list[int]:
        """Nodes per stage for a cluster of n nodes.

        Every node should carry the same load: a data node runs its m microbatches; the
        D*m*(L-1) visits to other stages spread over the other nodes. Equal load gives
        D = N / L data nodes; the rest split evenly over stages 1..S-1.
        """
        if self.stage_sizes is not None:
            if sum(self.stage_sizes) != n_nodes:
                raise UserError(
                    f"workload: stage_sizes add up to {sum(self.stage_sizes)} nodes but the cluster has {n_nodes}"
                )
            return list(self.stage_sizes)
        s = self.num_stages
        if n_nodes < s:
            raise UserError(f"a cluster of {n_nodes} nodes cannot hold {s} stages")
        data = max(1, round(n_nodes / self.path_length))
        data = min(data, n_nodes - (s - 1))
        rest = n_nodes - data
        base, extra = divmod(rest, s - 1)
        return [data] + [base + (1 if i < extra else 0) for i in range(s - 1)]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["stage_sizes"] is not None:
            d["stage_sizes"] = list(d["stage_sizes"])
        return d


def workload_from_dict(data: dict[str, Any], where: str = "workload") -> Workload:
    reject_unknown_keys(data, (f.name for f in fields(Workload)), where)
    defaults = Workload()
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "stage_sizes":
            if value is not None:
                if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
                    raise UserError(f"{where}: stage_sizes must be a list of integers")
                value = tuple(value)
        else:
            value = value_like(getattr(defaults, key), value, key, where)
        kwargs[key] = value
    return Workload(**kwargs)
