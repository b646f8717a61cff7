"""Tables and charts of the at-scale experiments from their run files (``claims_at_scale.py``).

Spreads are over seeds: mean and sample standard deviation (and min..max in the charts). The
omission figures are, per seed, the mean perplexity over every choice of k omitted non-data
stages, then mean and spread of that over seeds. "Half of the model" = half of the stages
omitted (3 of 6, or 2 of 4; stage 0 always runs).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

from skippipe.data.dataset import load_token_data
from skippipe.data.ngram import ngram_baselines
from skippipe.fileio import atomic_write_text
from skippipe.viz import save_png

SKIP_LAYOUT = {"skip-25": "S=4", "skip-33": "S=6", "layerdrop-33": "S=6", "full": "S=6"}


def load_runs(out: Path) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for f in sorted((out / "runs").glob("*.json")):
        r = json.loads(f.read_text())
        runs.setdefault(r["kind"], []).append(r)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in runs.items()}


def mean_std(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def omission_ppl(run: dict, layout: str, k: int) -> float:
    """Mean perplexity over the choices of k omitted stages in ``layout`` for one run."""
    row = run["omission"][layout][k]
    return float(np.mean([math.exp(x) for x in row["losses"]]))


def time_to_loss(run: dict, target: float) -> float | None:
    """Simulated hours until the validation loss first reaches ``target`` (linear between evaluations)."""
    pts = [(it * run["seconds_per_iteration_sim"] / 3600, loss) for it, loss in run["val"]]
    for (t0, l0), (t1, l1) in zip(pts, pts[1:], strict=False):
        if l1 <= target:
            return t1 if l0 == l1 else t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return None


def summarise(runs: dict[str, list[dict]], baselines: dict) -> dict:
    kinds = list(runs)
    full_mean = mean_std([r["final_val"] for r in runs["full"]])[0] if "full" in runs else None
    # a loss every run's curve reaches: the worst final curve point of all runs
    common = max(r["val"][-1][1] for rs in runs.values() for r in rs)
    summary: dict = {"baselines": baselines, "common_loss": common, "kinds": {}}
    for kind in kinds:
        rs = runs[kind]
        loss_m, loss_s = mean_std([r["final_val"] for r in rs])
        ppl_m, ppl_s = mean_std([r["final_val_ppl"] for r in rs])
        entry = {
            "seeds": [r["seed"] for r in rs], "final_val_loss": [r["final_val"] for r in rs],
            "final_val_loss_mean": loss_m, "final_val_loss_std": loss_s, "final_ppl_mean": ppl_m, "final_ppl_std": ppl_s,
            "vs_full": loss_m / full_mean if full_mean else None,
            "ppl_vs_bigram": ppl_m / baselines["bigram_ppl"],
            "seconds_per_iteration_sim": rs[0]["seconds_per_iteration_sim"], "steps": rs[0]["val"][-1][0],
            "tokens": rs[0]["val"][-1][0] * rs[0]["tokens_per_iteration"], "params": rs[0]["model"]["params"],
            "hours_to_common_loss": [time_to_loss(r, common) for r in rs],
            "omission": {},
        }
        for layout, rows in rs[0]["omission"].items():
            per_k = []
            for k in range(len(rows)):
                whole = [omission_ppl(r, layout, 0) for r in rs]
                at_k = [omission_ppl(r, layout, k) for r in rs]
                m, s = mean_std(at_k)
                ratio_m, ratio_s = mean_std([a / w for a, w in zip(at_k, whole, strict=True)])
                per_k.append({"omitted": k, "choices": len(rows[k]["choices"]), "ppl_mean": m, "ppl_std": s,
                              "vs_whole_mean": ratio_m, "vs_whole_std": ratio_s})
            entry["omission"][layout] = per_k
        summary["kinds"][kind] = entry
    return summary


def print_tables(summary: dict) -> None:
    b = summary["baselines"]
    print(f"\nvalidation text: unigram perplexity {b['unigram_ppl']:.1f}, bigram {b['bigram_ppl']:.1f} "
          f"(target for the full pipeline: <= {b['bigram_ppl'] / 2:.1f})")
    print(f"\n| configuration | s / iteration (sim.) | final val loss (mean ± sd) | perplexity | vs full | vs bigram "
          f"| simulated hours to val loss {summary['common_loss']:.3f} |")
    print("|---|---|---|---|---|---|---|")
    for kind, e in summary["kinds"].items():
        vs = f"{e['vs_full']:.4f}" if e["vs_full"] else "-"
        hours = [h for h in e["hours_to_common_loss"] if h is not None]
        reach = f"{np.mean(hours):.1f}" if len(hours) == len(e["hours_to_common_loss"]) else "not reached by every seed"
        print(f"| {kind} | {e['seconds_per_iteration_sim']:.2f} | {e['final_val_loss_mean']:.4f} ± {e['final_val_loss_std']:.4f} "
              f"| {e['final_ppl_mean']:.2f} ± {e['final_ppl_std']:.2f} | {vs} | {e['ppl_vs_bigram']:.3f} | {reach} |")
    for layout in ("S=6", "S=4"):
        half = (6 if layout == "S=6" else 4) // 2
        print(f"\nomission, layout {layout} (ratio to the same model's whole perplexity, mean ± sd over seeds)")
        print("| trained as | whole ppl | one stage omitted | half of the stages omitted |")
        print("|---|---|---|---|")
        for kind, e in summary["kinds"].items():
            rows = e["omission"][layout]
            print(f"| {kind} | {rows[0]['ppl_mean']:.2f} | {rows[1]['ppl_mean']:.2f} ({rows[1]['vs_whole_mean']:.3f} ± "
                  f"{rows[1]['vs_whole_std']:.3f}) | {rows[half]['ppl_mean']:.2f} ({rows[half]['vs_whole_mean']:.3f} ± "
                  f"{rows[half]['vs_whole_std']:.3f}) |")


def band(ax, xs_per_run: list[list[float]], ys_per_run: list[list[float]], label: str) -> None:
    x = np.asarray(xs_per_run[0])
    ys = np.asarray(ys_per_run)
    line, = ax.plot(x, ys.mean(axis=0), label=label)
    ax.fill_between(x, ys.min(axis=0), ys.max(axis=0), color=line.get_color(), alpha=0.2)


def charts(runs: dict[str, list[dict]], summary: dict, out: Path) -> None:
    b = summary["baselines"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for kind, rs in runs.items():
        e = summary["kinds"][kind]
        label = f"{kind}: {e['final_val_loss_mean']:.3f} ± {e['final_val_loss_std']:.3f}"
        tokens = [[it * r["tokens_per_iteration"] / 1e6 for it, _ in r["val"]] for r in rs]
        hours = [[it * r["seconds_per_iteration_sim"] / 3600 for it, _ in r["val"]] for r in rs]
        losses = [[loss for _, loss in r["val"]] for r in rs]
        band(axes[0], tokens, losses, label)
        band(axes[1], hours, losses, label)
    for ax in axes:
        ax.axhline(math.log(b["bigram_ppl"]), color="grey", ls="--", lw=1, label=f"bigram ({b['bigram_ppl']:.0f})")
        ax.axhline(math.log(b["bigram_ppl"] / 2), color="grey", ls=":", lw=1, label="half the bigram perplexity")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("training tokens seen (millions)")
    axes[1].set_xlabel("simulated wall-clock on the 20-node reference network (hours)")
    if "full" in runs:  # slower configurations run off the right edge
        full = runs["full"][0]
        axes[1].set_xlim(0, 1.1 * full["val"][-1][0] * full["seconds_per_iteration_sim"] / 3600)
    axes[0].set_ylabel("validation loss (whole model)")
    axes[0].set_ylim(top=min(8.0, math.log(b["unigram_ppl"]) + 0.3))
    axes[1].legend(fontsize=8)
    fig.suptitle("Convergence with skipping: mean over seeds, band = min..max")
    fig.tight_layout()
    save_png(fig, out / "convergence.png")

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, layout in zip(axes, ("S=6", "S=4"), strict=True):
        for kind, rs in runs.items():
            rows = rs[0]["omission"][layout]
            ks = list(range(len(rows)))
            per_run = [[omission_ppl(r, layout, k) for k in ks] for r in rs]
            band(ax, [ks] * len(rs), per_run, kind)
        ax.axvline(len(LAYOUT_SIZES[layout]) // 2, color="grey", ls=":", lw=1)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(range(len(LAYOUT_SIZES[layout])))
        ax.set_xlabel(f"non-data stages omitted at inference ({layout}; dotted: half of the stages)")
        ax.set_ylabel("validation perplexity (mean over choices)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle("Stages omitted at inference: mean over seeds, band = min..max")
    fig.tight_layout()
    save_png(fig, out / "omission.png")


LAYOUT_SIZES = {"S=6": [2] * 6, "S=4": [3] * 4}


def report(out: Path, tokenizer: str, vocab: int, cache_dir: str | None) -> dict:
    runs = load_runs(out)
    if not runs:
        raise SystemExit(f"no run files under {out / 'runs'}")
    cfg = next(iter(runs.values()))[0]["train_config"]
    data = load_token_data(tokenizer=cfg["tokenizer"], vocab_size=cfg["vocab_size"] or vocab, cache_dir=cfg.get("cache_dir"))
    baselines = ngram_baselines(data.train, data.val, data.vocab_size).to_dict()
    summary = summarise(runs, baselines)
    print_tables(summary)
    charts(runs, summary, out)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    print(f"\nwrote {out / 'summary.json'}, {out / 'convergence.png'}, {out / 'omission.png'}")
    return summary
