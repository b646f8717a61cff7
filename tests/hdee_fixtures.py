"""Shared pieces of the HDEE tests: folder domains of made-up text and a tiny CPU config."""

from __future__ import annotations

import random
from pathlib import Path

DOMAINS = (("red", "train", "easy"), ("blue", "train", "moderate"), ("green", "train", "hard"),
           ("gold", "eval", ""), ("grey", "eval", ""))


def write_domains(root: Path) -> None:
    """Six documents per domain, each domain with its own small vocabulary (so experts differ)."""
    for k, (name, _, _) in enumerate(DOMAINS):
        rng = random.Random(k)
        words = [name[:2] + "".join(rng.choice("abcdefghij"[k : k + 5]) for _ in range(3)) for _ in range(12)]
        folder = root / "text" / name
        folder.mkdir(parents=True)
        for i in range(6):
            (folder / f"{i}.txt").write_text(" ".join(rng.choice(words) for _ in range(150 + 20 * i)) + ".\n")


def write_config(root: Path, **sections: str) -> Path:
    """A tiny HDEE config in ``root`` (its run folder ``root/run``); ``sections`` replace whole tables."""
    write_domains(root)
    tables = {
        "run": 'dir = "run"\ncheckpoint_every = 2\nlog_every = 4',
        "data": 'tokenizer = "bytes"',
        "model": 'preset = "tiny"\nd_model = 16\nn_layers = 1\nn_heads = 2\nn_kv_heads = 1\nffn_dim = 32\nctx = 16',
        "train": "steps = 8\nbatch_size = 4\nwarmup_steps = 2\nlr = 3e-3",
        "seed_model": "steps = 8\nbatch_size = 4\nwarmup_steps = 2",
        "difficulty": "eval_windows = 4\nprobe_steps = 8",
        "ensemble": 'difficulty = ["manual", "seed-loss", "probe"]\neval_windows = 6\nprior_windows = 4\nbatch_size = 4\n'
                    "budget_tolerance = 0.1",  # 8 steps: rounding to whole steps moves a budget by several %
        **sections,
    }
    text = "".join(f"[{name}]\n{body}\n\n" for name, body in tables.items())
    for name, role, level in DOMAINS:
        text += f'[[domains]]\nname = "{name}"\nsource = "folder"\npath = "text/{name}"\nrole = "{role}"\n'
        text += f'difficulty = "{level}"\n\n' if level else "\n"
    path = root / "hdee.toml"
    path.write_text(text)
    return path
