"""``skippipe hdee train``: the phases of one run, each resumable.

1. data: split the domains, train the tokenizer, encode (``RUN/data/``);
2. seed models on the mixture of the training domains, one per size the experts branch from
   (``RUN/seeds/<size>/``; only when ``[seed_model] steps > 0``);
3. difficulty: the manual guess and/or measured scores (``RUN/difficulty.json``; probes in
   ``RUN/probes/``);
4. plan: every configuration's experts, their FLOPs and the budget check (``RUN/plan.json``);
5. experts: every distinct expert once, in parallel jobs (``RUN/experts/<domain>-<size>-<steps>/``).

An expert shared by several configurations (e.g. the moderate M expert) is trained once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from skippipe.fileio import atomic_write_text
from skippipe.hdee import difficulty as diff
from skippipe.hdee.budget import Configuration, ExpertPlan, level_of, plan_configurations
from skippipe.hdee.config import SIZES, HDEEConfig, TrainSection
from skippipe.hdee.data import RunData, prepare_data
from skippipe.hdee.flops import format_flops, train_flops_per_step
from skippipe.hdee.jobs import run_jobs
from skippipe.hdee.train import JobSpec


@dataclass
class TrainSummary:
    finished: bool  # every job reached its last step
    configurations: list[Configuration]
    experts: int
    seconds: float


def _spec(cfg: HDEEConfig, data: RunData, kind: str, name: str, domains: tuple[str, ...], size: str, steps: int,
          section: TrainSection, init: str = "", init_digest: str = "", eval_domains: tuple[str, ...] = (),
          eval_windows: int = 32) -> JobSpec:
    return JobSpec(
        kind=kind, name=name, domains=domains, size=size, model=cfg.model_config(size, data.vocab_size).to_dict(),
        steps=steps, batch_size=section.batch_size, lr=section.lr, min_lr=section.min_lr,
        warmup_steps=min(section.warmup_steps, steps), weight_decay=section.weight_decay, grad_clip=section.grad_clip,
        seed=cfg.run.seed, data_digest=data.digest, init=init, init_digest=init_digest, eval_domains=eval_domains,
        eval_windows=eval_windows, checkpoint_every=cfg.run.checkpoint_every, keep_checkpoints=cfg.run.keep_checkpoints,
        log_every=cfg.run.log_every,
    )


def seed_specs(cfg: HDEEConfig, data: RunData) -> dict[str, JobSpec]:
    """The seed models: M always (difficulty is measured with it); S and L too when experts of
    those sizes branch from a seed."""
    if cfg.seed_model.steps < 1:
        return {}
    sizes = ["M"]
    if cfg.seed_model.branch and any(k in ("size", "both") for k in cfg.ensemble.configurations):
        sizes = list(SIZES)
    train = tuple(d.name for d in cfg.train_domains)
    return {
        s: _spec(cfg, data, "seed", s, train, s, cfg.seed_model.steps, cfg.seed_model,
                 eval_domains=train, eval_windows=cfg.difficulty.eval_windows)
        for s in sizes
    }


def _branch_point(cfg: HDEEConfig, run_dir: Path, seeds: dict[str, JobSpec], size: str) -> tuple[str, str]:
    if not cfg.seed_model.branch or size not in seeds:
        return "", ""
    return str(run_dir / seeds[size].folder / "final"), seeds[size].digest()


def expert_spec(cfg: HDEEConfig, data: RunData, run_dir: Path, seeds: dict[str, JobSpec], plan: ExpertPlan) -> JobSpec:
    init, init_digest = _branch_point(cfg, run_dir, seeds, plan.size)
    return _spec(cfg, data, "expert", plan.name, (plan.domain,), plan.size, plan.steps, cfg.train, init, init_digest,
                 eval_domains=(plan.domain,))


def measure_difficulty(cfg: HDEEConfig, data: RunData, run_dir: Path, seeds: dict[str, JobSpec], until: int | None,
                       log: Callable[[str], None]) -> dict[str, dict] | None:
    """Scores per difficulty source: {"raw": {domain: value}, "z": {domain: z}}; None if a probe stopped early."""
    from skippipe.hdee.checkpoint import final_of

    names = [d.name for d in cfg.train_domains]
    out: dict[str, dict] = {}
    for source in cfg.ensemble.difficulty:
        if source == "manual":
            z = diff.manual_scores({d.name: d.difficulty for d in cfg.train_domains})
            out[source] = {"raw": {d.name: d.difficulty for d in cfg.train_domains}, "z": z}
        elif source == "seed-loss":
            saved = final_of(run_dir / seeds["M"].folder, seeds["M"].digest())
            assert saved is not None
            bpt = {n: data.domains[n].bytes_per_token["val"] for n in names}
            raw = diff.seed_loss_raw({n: saved.extra["val_loss"][n] for n in names}, bpt)
            out[source] = {"raw": raw, "z": diff.normalise(raw)}
        elif source == "probe":
            init, init_digest = _branch_point(cfg, run_dir, seeds, "M")
            specs = [
                _spec(cfg, data, "probe", n, (n,), "M", cfg.difficulty.probe_steps, cfg.train, init, init_digest)
                for n in names
            ]
            results = run_jobs(specs, run_dir, cfg.run.jobs, until, log)
            if any(r.steps_done < r.steps for r in results):
                return None
            raw = diff.probe_raw({n: r.losses for n, r in zip(names, results)})
            out[source] = {"raw": raw, "z": diff.normalise(raw), "flops": sum(s.flops() for s in specs)}
    for source, scores in out.items():
        scores["levels"] = {d: level_of(z) for d, z in scores["z"].items()}
        shown = ", ".join(f"{d} {scores['levels'][d]} ({z:+.2f})" for d, z in scores["z"].items())
        log(f"difficulty {source}: {shown}")
    return out


def plan_run(cfg: HDEEConfig, vocab_size: int, scores: dict[str, dict]) -> tuple[list[Configuration], dict[str, int]]:
    """The configurations and the training FLOPs of one step of each size."""
    step_flops = {}
    for size in SIZES:
        m = cfg.model_config(size, vocab_size)
        step_flops[size] = train_flops_per_step(m, cfg.train.batch_size, m.ctx)
    configs = plan_configurations(
        cfg.ensemble.configurations, [d.name for d in cfg.train_domains], {s: v["z"] for s, v in scores.items()},
        cfg.train.steps, cfg.ensemble.spread, step_flops, cfg.ensemble.budget_tolerance,
    )
    return configs, step_flops


def format_plan(configs: list[Configuration], budget: int) -> str:
    lines = [f"{'configuration':<22} {'experts (domain size x steps)':<60} {'FLOPs':>14} {'vs budget':>9}"]
    for c in configs:
        experts = ", ".join(f"{e.domain} {e.size}x{e.steps}" for e in c.experts)
        lines.append(f"{c.name:<22} {experts:<60} {format_flops(c.flops):>14} {100 * (c.flops / budget - 1):+8.2f}%")
    return "\n".join(lines)


def train_run(cfg: HDEEConfig, until: int | None = None, log: Callable[[str], None] = print) -> TrainSummary:
    import time

    start = time.perf_counter()
    run_dir = Path(cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.json", json.dumps(cfg.to_dict(), indent=1) + "\n")
    data = prepare_data(cfg, run_dir, log)
    seeds = seed_specs(cfg, data)
    if seeds:
        log(f"seed models: {', '.join(seeds)} on the mixture of {', '.join(d.name for d in cfg.train_domains)}, "
            f"{cfg.seed_model.steps} steps each")
        results = run_jobs(list(seeds.values()), run_dir, cfg.run.jobs, until, log)
        if any(r.steps_done < r.steps for r in results):
            return TrainSummary(False, [], 0, time.perf_counter() - start)
    scores = measure_difficulty(cfg, data, run_dir, seeds, until, log)
    if scores is None:
        return TrainSummary(False, [], 0, time.perf_counter() - start)
    atomic_write_text(run_dir / "difficulty.json", json.dumps(scores, indent=1) + "\n")
    configs, step_flops = plan_run(cfg, data.vocab_size, scores)
    budget = len(cfg.train_domains) * cfg.train.steps * step_flops["M"]
    log(format_plan(configs, budget))
    unique = {e.name: e for c in configs for e in c.experts}
    specs = [expert_spec(cfg, data, run_dir, seeds, e) for e in unique.values()]
    plan = {
        "budget_flops": budget,
        "step_flops": step_flops,
        "configurations": [c.to_dict() for c in configs],
        "experts": {s.name: {"folder": s.folder, "domain": s.domains[0], "size": s.size, "steps": s.steps,
                             "flops": s.flops(), "branched_from": s.init} for s in specs},
        "seed_models": {k: {"folder": s.folder, "steps": s.steps, "flops": s.flops()} for k, s in seeds.items()},
        "difficulty": scores,
    }
    atomic_write_text(run_dir / "plan.json", json.dumps(plan, indent=1) + "\n")
    log(f"experts: {len(specs)} distinct over {len(configs)} configurations, {cfg.run.jobs} at a time")
    results = run_jobs(specs, run_dir, cfg.run.jobs, until, log)
    finished = all(r.steps_done >= r.steps for r in results)
    return TrainSummary(finished, configs, len(specs), time.perf_counter() - start)
