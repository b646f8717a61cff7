"""Tables (plain text / Markdown) and the PNG chart of HDEE evaluation results.

``summarise(results_list)`` turns the ``results.json`` of one or more runs (seeds) into
mean and spread per (combiner, configuration, domain); the tables and the chart read that.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from skippipe.errors import UserError
from skippipe.viz import save_png

Stat = tuple[float, float, int]  # mean, sample standard deviation (0 for one run), runs


def _stat(values: list[float]) -> Stat:
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0, len(a)


def summarise(runs: list[dict[str, Any]], combiners: tuple[str, ...] = ("val_prior", "uniform", "best_single", "oracle")) -> dict:
    """{"domains": {...}, "configurations": [...], "ppl": {combiner: {config: {domain: Stat}}},
    "experts": {expert: {domain: Stat}}} over runs (perplexities; mean and spread over runs)."""
    first = runs[0]
    configs = list(first["configurations"])
    domains = list(first["domains"])
    ppl: dict[str, dict[str, dict[str, Stat]]] = {}
    for comb in combiners:
        ppl[comb] = {}
        for c in configs:
            row = {}
            for d in domains:
                vals = [r["configurations"][c]["domains"][d][comb] for r in runs if c in r["configurations"]]
                if vals and all(v is not None for v in vals):
                    row[d] = _stat([math.exp(v) for v in vals])
            ppl[comb][c] = row
    slots: dict[tuple[str, str], list[str]] = {}  # (configuration, domain) -> that expert's name in each run
    for r in runs:
        for slot, name in _expert_slots(r).items():
            slots.setdefault(slot, []).append(name)
    experts: dict[str, dict[str, Stat]] = {}
    for slot, names in slots.items():
        by_run = [r["experts"][n] for r in runs for n in [_expert_slots(r).get(slot)] if n is not None]
        experts[_slot_label(slot, names)] = {d: _stat([math.exp(e[d]) for e in by_run]) for d in domains}
    return {"domains": first["domains"], "configurations": configs, "ppl": ppl, "experts": experts, "runs": len(runs)}


def _expert_slots(run: dict[str, Any]) -> dict[tuple[str, str], str]:
    """Each distinct expert of a run under (the first configuration that uses it, its domain): the
    same slot in runs with other seeds, even where a measured difficulty gave it other steps."""
    seen: dict[str, tuple[str, str]] = {}
    for c, info in run["configurations"].items():
        for name in info["experts"]:
            if name not in seen:
                seen[name] = (c, name.rsplit("-", 2)[0])
    return {slot: name for name, slot in seen.items()}


def _slot_label(slot: tuple[str, str], names: list[str]) -> str:
    """``bible-M-240`` when every run trained the same expert, else ``bible-M-384/380 (steps/seed-loss)``."""
    unique = list(dict.fromkeys(names))
    if len(unique) == 1:
        return unique[0]
    domain, size = slot[1], unique[0].rsplit("-", 2)[1]
    return f"{domain}-{size}-{'/'.join(n.rsplit('-', 1)[1] for n in names)} ({slot[0]})"


def _cell(s: Stat, best: bool) -> str:
    mean, std, n = s
    text = f"{mean:.2f}" + (f" ± {std:.2f}" if n > 1 else "")
    return f"**{text}**" if best else text


def markdown_table(summary: dict, combiner: str) -> str:
    """Rows: domains; columns: configurations; the best configuration of each row in bold."""
    configs = summary["configurations"]
    rows = summary["ppl"][combiner]
    head = "| domain | role | " + " | ".join(configs) + " |"
    lines = [head, "|" + "---|" * (len(configs) + 2)]
    for d, info in summary["domains"].items():
        cells = {c: rows[c].get(d) for c in configs}
        present = [v[0] for v in cells.values() if v is not None]
        best = min(present) if present else None
        role = "train" if info["role"] == "train" else "held out"
        text = [_cell(v, v[0] == best) if v is not None else "—" for v in cells.values()]
        lines.append(f"| {d} | {role} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def experts_table(summary: dict) -> str:
    """Rows: experts; columns: domains (every expert alone, test perplexity)."""
    domains = list(summary["domains"])
    lines = ["| expert | " + " | ".join(domains) + " |", "|" + "---|" * (len(domains) + 1)]
    for name, row in summary["experts"].items():
        lines.append(f"| {name} | " + " | ".join(_cell(row[d], False) for d in domains) + " |")
    return "\n".join(lines)


def text_table(summary: dict, combiner: str) -> str:
    """A fixed-width table for the terminal (one run: no spread)."""
    configs = summary["configurations"]
    rows = summary["ppl"][combiner]
    width = max(12, *(len(c) for c in configs))
    lines = [f"{'domain':<14} {'role':<8} " + " ".join(f"{c:>{width}}" for c in configs)]
    for d, info in summary["domains"].items():
        vals = [rows[c].get(d) for c in configs]
        best = min((v[0] for v in vals if v is not None), default=None)
        cells = [(f"{v[0]:.2f}" + ("*" if v[0] == best else " ")) if v is not None else "-" for v in vals]
        role = "train" if info["role"] == "train" else "held-out"
        lines.append(f"{d:<14} {role:<8} " + " ".join(f"{x:>{width}}" for x in cells))
    return "\n".join(lines)


def wins(summary: dict, combiner: str = "val_prior", baseline: str = "homogeneous") -> dict[str, str]:
    """The configuration with the lowest mean perplexity on each domain."""
    rows = summary["ppl"][combiner]
    out = {}
    for d in summary["domains"]:
        vals = {c: rows[c][d][0] for c in summary["configurations"] if d in rows[c]}
        if vals:
            out[d] = min(vals, key=lambda c: (vals[c], c != baseline))
    return out


def chart(summary: dict, path: str | Path, combiner: str = "val_prior", baseline: str = "homogeneous", title: str = "") -> Path:
    """Grouped bars: each configuration's ensemble perplexity relative to the homogeneous one, per
    domain (below zero = better than homogeneous), with the spread over runs as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if Path(path).suffix.lower() != ".png":
        raise UserError(f"{path}: the chart is written as PNG; give a file name ending in .png")
    configs = [c for c in summary["configurations"] if c != baseline]
    domains = list(summary["domains"])
    rows = summary["ppl"][combiner]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * len(domains) * max(1, len(configs)) / 3), 4.2), dpi=120)
    width = 0.8 / max(1, len(configs))
    x = np.arange(len(domains))
    for i, c in enumerate(configs):
        rel, err = [], []
        for d in domains:
            base, mine = rows[baseline].get(d), rows[c].get(d)
            if base is None or mine is None:
                rel.append(np.nan)
                err.append(0.0)
                continue
            rel.append(100 * (mine[0] / base[0] - 1))
            err.append(100 * mine[1] / base[0])
        ax.bar(x + (i - (len(configs) - 1) / 2) * width, rel, width, yerr=err if summary["runs"] > 1 else None,
               label=c, capsize=2)
    ax.axhline(0, color="black", linewidth=0.8)
    labels = [f"{d}\n({'held out' if summary['domains'][d]['role'] != 'train' else 'train'})" for d in domains]
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel(f"test perplexity vs {baseline} (%)")
    runs = summary["runs"]
    ax.set_title(title or f"HDEE ensembles ({combiner.replace('_', ' ')}), {runs} run{'s' if runs > 1 else ''}")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    try:
        save_png(fig, path)
    finally:
        plt.close(fig)
    return Path(path)
