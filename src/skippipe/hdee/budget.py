"""Configurations: a size and a step count for every training domain's expert, all under one budget.

The budget is the homogeneous BTM baseline: every expert of size M trained for ``steps`` steps.
A domain's difficulty is a score z in [-1, 1] (easy -1, moderate 0, hard +1 when set by hand):

- ``homogeneous``: M, ``steps`` for every expert;
- ``steps``: M, (1 + spread * z) x ``steps`` (the paper's 300 / 400 / 500 for spread 0.25);
- ``size``: S / M / L for z < -1/3 / in between / > 1/3, equal steps;
- ``both``: the size of ``size`` and the step multiplier of ``steps`` at once.

All step counts are then scaled by one factor so the FLOPs match the budget (the factor is 1
whenever the difficulties balance, as in the paper; it corrects an unbalanced assignment and
the extra cost of ``both``). Steps are rounded to whole numbers, so budgets match to within
``tolerance``; anything further off is an error. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from skippipe.errors import UserError

KINDS = ("homogeneous", "steps", "size", "both")


class BudgetError(UserError):
    """Configurations that cannot be brought onto the same FLOPs budget."""


def size_of(z: float) -> str:
    return "L" if z > 1 / 3 else "S" if z < -1 / 3 else "M"


def level_of(z: float) -> str:
    return {"S": "easy", "M": "moderate", "L": "hard"}[size_of(z)]


@dataclass(frozen=True)
class ExpertPlan:
    domain: str
    size: str  # S, M or L
    steps: int
    flops: int  # training FLOPs

    @property
    def name(self) -> str:
        return f"{self.domain}-{self.size}-{self.steps}"


@dataclass(frozen=True)
class Configuration:
    name: str  # "homogeneous" or "<kind>/<difficulty source>", e.g. "steps/manual"
    kind: str
    difficulty: str  # the difficulty source ("" for homogeneous)
    experts: tuple[ExpertPlan, ...]

    @property
    def flops(self) -> int:
        return sum(e.flops for e in self.experts)

    def expert_for(self, domain: str) -> ExpertPlan | None:
        return next((e for e in self.experts if e.domain == domain), None)

    def to_dict(self) -> dict:
        return {
            "name": self.name, "kind": self.kind, "difficulty": self.difficulty, "flops": self.flops,
            "experts": [
                {"name": e.name, "domain": e.domain, "size": e.size, "steps": e.steps, "flops": e.flops} for e in self.experts
            ],
        }

    @staticmethod
    def from_dict(d: dict) -> Configuration:
        experts = tuple(ExpertPlan(e["domain"], e["size"], int(e["steps"]), int(e["flops"])) for e in d["experts"])
        return Configuration(d["name"], d["kind"], d["difficulty"], experts)


def plan_configuration(
    kind: str, difficulty: str, scores: dict[str, float], steps: int, spread: float, step_flops: dict[str, int]
) -> Configuration:
    """One configuration for the domains of ``scores`` (domain -> z), matched to the homogeneous budget."""
    if kind not in KINDS:
        raise BudgetError(f"unknown configuration {kind!r} (known: {', '.join(KINDS)})")
    for name, z in scores.items():
        if not -1.0 <= z <= 1.0:
            raise BudgetError(f"difficulty of {name} must be in [-1, 1], got {z}")
    vary_size, vary_steps = kind in ("size", "both"), kind in ("steps", "both")
    sizes = {d: size_of(z) if vary_size else "M" for d, z in scores.items()}
    mult = {d: 1.0 + spread * z if vary_steps else 1.0 for d, z in scores.items()}
    budget = len(scores) * steps * step_flops["M"]
    scale = budget / sum(step_flops[sizes[d]] * steps * mult[d] for d in scores)
    experts = []
    for d in scores:
        n = max(1, round(scale * steps * mult[d]))
        experts.append(ExpertPlan(d, sizes[d], n, n * step_flops[sizes[d]]))
    name = kind if kind == "homogeneous" else f"{kind}/{difficulty}"
    return Configuration(name, kind, "" if kind == "homogeneous" else difficulty, tuple(experts))


def plan_configurations(
    kinds: tuple[str, ...] | list[str], domains: list[str], scores_by_source: dict[str, dict[str, float]], steps: int,
    spread: float, step_flops: dict[str, int], tolerance: float,
) -> list[Configuration]:
    """Every requested configuration (homogeneous once; the others once per difficulty source),
    each checked against the homogeneous budget."""
    out: list[Configuration] = []
    for kind in kinds:
        if kind == "homogeneous":
            out.append(plan_configuration(kind, "", {d: 0.0 for d in domains}, steps, spread, step_flops))
            continue
        if not scores_by_source:
            raise BudgetError(f"configuration {kind!r} needs a difficulty source")
        for source, scores in scores_by_source.items():
            if sorted(scores) != sorted(domains):
                raise BudgetError(f"difficulty {source!r} scores {sorted(scores)}, not the training domains {sorted(domains)}")
            out.append(plan_configuration(kind, source, {d: scores[d] for d in domains}, steps, spread, step_flops))
    check_budgets(out, len(domains) * steps * step_flops["M"], tolerance)
    return out


def check_budgets(configs: list[Configuration], budget: int, tolerance: float) -> None:
    for c in configs:
        gap = abs(c.flops - budget) / budget
        if gap > tolerance:
            raise BudgetError(
                f"configuration {c.name} costs {c.flops:.4g} FLOPs, {100 * gap:.2f} % away from the budget {budget:.4g} "
                f"(tolerance {100 * tolerance:.2f} %); use more steps so rounding matters less"
            )
