"""``skippipe hdee``: heterogeneous domain expert ensembles (HDEE).

- ``skippipe hdee train CONFIG.toml``: data, seed models, difficulty, plan, then every expert
  (parallel jobs, progress per expert, resumable per expert);
- ``skippipe hdee eval RUN``: per-domain perplexity table of every configuration + a PNG chart;
- ``skippipe hdee generate RUN``: text sampled from one configuration's ensemble.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from skippipe.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="hdee_command", metavar="ACTION", required=True)
    t = sub.add_parser("train", help="train every expert of a config (resumable)", description="train every expert of a config")
    t.add_argument("config", help="HDEE config (TOML), e.g. examples/hdee-cpu.toml")
    t.add_argument("--run-dir", help="run folder (default: [run] dir of the config)")
    t.add_argument("--seed", type=int, help="override [run] seed (model initialisation and data order)")
    t.add_argument("--jobs", type=int, help="override [run] jobs (training processes at once)")
    t.add_argument("--until", type=int, help="stop every job after this step (a checkpoint is written; rerun to continue)")
    t.add_argument("--fresh", action="store_true", help="delete the earlier results in the run folder first")
    e = sub.add_parser("eval", help="per-domain perplexity of every configuration", description="evaluate a finished run")
    e.add_argument("run", help="run folder of `skippipe hdee train`")
    e.add_argument("--windows", type=int, help="test windows per domain (default: [ensemble] eval_windows)")
    e.add_argument("--chart", help="PNG chart path (default: RUN/eval/hdee.png)")
    e.add_argument("--json", action="store_true", help="print the results as JSON")
    g = sub.add_parser("generate", help="sample text from an ensemble", description="sample text from an ensemble")
    g.add_argument("run", help="run folder of `skippipe hdee train`")
    g.add_argument("--configuration", default="homogeneous", help="which ensemble (default: homogeneous)")
    g.add_argument("--prompt", default="", help="text to continue")
    g.add_argument("--tokens", type=int, default=200, help="at most this many new tokens (default 200)")
    g.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (0: greedy)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed")
    g.add_argument("--prior", default="uniform", help="'uniform', or a domain whose validation prior (from eval) to use")


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    return {"train": _train, "eval": _eval, "generate": _generate}[args.hdee_command](args)


RESULT_PARTS = ("data", "seeds", "probes", "experts", "eval", "plan.json", "difficulty.json", "config.json")


def _train(args: argparse.Namespace) -> int:
    from skippipe.hdee.config import load_hdee_config
    from skippipe.hdee.pipeline import train_run

    cfg = load_hdee_config(args.config)
    changes = {k: v for k, v in (("dir", args.run_dir), ("seed", args.seed), ("jobs", args.jobs)) if v is not None}
    if changes:
        cfg = cfg.with_run(**changes)
    if args.until is not None and args.until < 1:
        raise UserError("--until must be at least 1")
    run_dir = Path(cfg.run.dir)
    if args.fresh and run_dir.exists():
        for part in RESULT_PARTS:  # only what this command writes
            p = run_dir / part
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
    summary = train_run(cfg, until=args.until, log=lambda line: print(line, flush=True))
    if not summary.finished:
        print(f"stopped early; run the same command again to continue ({run_dir})")
        return 0
    print(f"trained {summary.experts} experts for {len(summary.configurations)} configurations in {summary.seconds:.0f} s; "
          f"next: skippipe hdee eval {run_dir}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from skippipe.hdee.evaluate import evaluate_run
    from skippipe.hdee.report import chart, summarise, text_table

    if args.windows is not None and args.windows < 1:
        raise UserError("--windows must be at least 1")
    run_dir = Path(args.run)
    results = evaluate_run(run_dir, args.windows, log=lambda line: print(line, flush=True) if not args.json else None)
    summary = summarise([results])
    path = chart(summary, args.chart or run_dir / "eval" / "hdee.png")
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for comb, text in (("val_prior", "ensemble, prior fitted on validation"), ("uniform", "ensemble, uniform prior"),
                       ("best_single", "best single expert (chosen on validation)"), ("oracle", "the domain's own expert")):
        print(f"\ntest perplexity: {text} (* = lowest)")
        print(text_table(summary, comb))
    print(f"\nwrote {run_dir / 'eval' / 'results.json'} and {path}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    import torch

    from skippipe.hdee.data import load_run_tokenizer
    from skippipe.hdee.evaluate import read_run
    from skippipe.hdee.generate import generate
    from skippipe.hdee.train import load_expert

    run_dir = Path(args.run)
    _, plan, configs = read_run(run_dir)
    chosen = next((c for c in configs if c.name == args.configuration), None)
    if chosen is None:
        raise UserError(f"no configuration {args.configuration!r} in {run_dir} (known: {', '.join(c.name for c in configs)})")
    names = [e.name for e in chosen.experts]
    log_prior = None
    if args.prior != "uniform":
        res = run_dir / "eval" / "results.json"
        if not res.is_file():
            raise UserError(f"--prior {args.prior}: no {res}; run `skippipe hdee eval {run_dir}` first")
        rows = json.loads(res.read_text())["configurations"][chosen.name]["domains"]
        if args.prior not in rows:
            raise UserError(f"--prior: unknown domain {args.prior!r} (known: uniform, {', '.join(rows)})")
        log_prior = torch.tensor([rows[args.prior]["prior"][n] for n in names], dtype=torch.float64).log()
    models = [load_expert(run_dir, plan["experts"][n]["folder"]) for n in names]
    tok = load_run_tokenizer(run_dir)
    sample = generate(models, tok, args.prompt, args.tokens, args.temperature, args.seed, log_prior)
    print(sample.prompt + sample.text)

    def shown(weights: list[float]) -> str:
        return ", ".join(f"{n} {w:.2f}" for n, w in zip(names, weights))

    print(f"\n[posterior after the prompt: {shown(sample.prompt_weights)}; after the text: {shown(sample.weights)}]")
    return 0
