"""Shared pieces of the runtime tests: a tiny model config and small plans with swaps, skips,
memory limits, release times and ``after`` dependencies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from skippipe.cluster import cluster_from_dict
from skippipe.planfile import Microbatch, Plan, save_plan
from skippipe.planner.problem import build_problem
from skippipe.workload import Workload

TINY_MODEL = {"preset": "tiny", "d_model": 32, "n_layers": 4, "n_heads": 2, "n_kv_heads": 1, "ffn_dim": 64, "ctx": 16}
TINY_TRAIN = {"tokenizer": "bytes", "corpus": ["shakespeare"], "samples_per_microbatch": 2, "warmup_steps": 1, "lr": 3e-3}


def seven_node_plan() -> Plan:
    """7 nodes, stages [[0, 1], [2, 3], [4], [5, 6]], paths of 3 stages with a swap, a skip of
    two stages, a shared node, memory 2, staggered releases and an ``after`` dependency."""
    n = 7
    rng = np.random.default_rng(0)
    transfer = rng.uniform(0.2, 0.6, size=(n, n))
    c = cluster_from_dict({"transfer_s": transfer.tolist(), "forward_s": [0.3, 0.3, 0.2, 0.25, 0.2, 0.3, 0.2]})
    w = Workload(num_stages=4, path_length=3, microbatches_per_data_node=3, n_layers=4, memory=2,
                 stage_sizes=(2, 2, 1, 2), d_model=32, ctx=16, samples_per_microbatch=2)
    p = build_problem(c, w)
    mbs = [
        Microbatch(0, 0, [2, 4]),  # stages 1, 2
        Microbatch(1, 0, [4, 3]),  # stages 2, 1: a swap
        Microbatch(2, 0, [3, 5], release_s=0.5, after=0),  # stages 1, 3
        Microbatch(3, 1, [5, 4]),  # jump to 3, then swap back to 2
        Microbatch(4, 1, [2, 6]),
        Microbatch(5, 1, [4, 6], release_s=1.0),
    ]
    return p.make_plan([[0, 1], [2, 3], [4], [5, 6]], mbs, method="test", seed=0, max_load=[9] * n)


def write_config(folder: Path, plan: Plan, steps: int = 3, runtime: dict | None = None, run: dict | None = None,
                 train: dict | None = None) -> Path:
    """plan.json + a JSON run config in ``folder``; returns the config path."""
    folder.mkdir(parents=True, exist_ok=True)
    save_plan(plan, folder / "plan.json")
    cfg = {
        "run": {"dir": str(folder / "run"), **(run or {})},
        "plan": {"file": str(folder / "plan.json")},
        "train": {**TINY_TRAIN, "steps": steps, **(train or {})},
        "model": TINY_MODEL,
        "runtime": {"emulate": False, "timeout_s": 60.0, "rendezvous_timeout_s": 30.0, "wire": "fp32", **(runtime or {})},
    }
    path = folder / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def same_checkpoint(a: Path, b: Path) -> None:
    """Two checkpoint folders hold the same files with the same contents: JSON files equal (the
    manifest up to the sha256 of optimizer files), safetensors files with bit-equal tensors and
    equal metadata (safetensors writes metadata keys in no fixed order, so their bytes may differ)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    names = sorted(p.name for p in a.iterdir())
    assert sorted(p.name for p in b.iterdir()) == names
    for name in names:
        fa, fb = a / name, b / name
        if name.endswith(".safetensors"):
            ta, tb = load_file(fa), load_file(fb)
            assert sorted(ta) == sorted(tb) and all(ta[k].dtype == tb[k].dtype and (ta[k] == tb[k]).all() for k in ta), name
            with safe_open(fa, framework="pt") as ha, safe_open(fb, framework="pt") as hb:
                assert ha.metadata() == hb.metadata(), name
        elif name == "manifest.json":
            ma, mb = json.loads(fa.read_text()), json.loads(fb.read_text())
            optim = [n for n in ma["files"] if n.endswith(".optim.safetensors")]
            for m in (ma, mb):
                for n in optim:
                    m["files"][n] = "(tensors compared)"
            assert ma == mb
        else:
            assert fa.read_bytes() == fb.read_bytes(), name
