"""Less on the wire: activations and gradients in fp32, bf16 or int8 (per-row scales).

1. Simulated iteration time (makespan) of a SkipPipe plan on the 20-node reference cluster
   (``gcp-2025/geo-distributed/20``, the reference workload: 6 stages, paths of 4, a
   LLaMA-500M-like layout, d_model 1024, 1024 tokens x 8 samples a microbatch), planned and
   simulated with each format's bytes per hop (``skippipe.costs.wire_bytes``). The WAN emulation
   of ``skippipe train`` delays every message by the plan's transfer times, so an emulated run
   follows these figures by construction; they are not measured separately here.
2. Convergence cost: the tiny model trained on the built-in corpora with the single-process
   reference executor, every inter-node hop (activation forward, gradient backward) passed
   through the wire format exactly as the runtime's transport does (``skippipe.runtime.wire``);
   same plan, data, seed and samples for every format. Prints the final validation loss and
   its ratio to fp32's.

    python3 benchmarks/wire_formats.py                     # ~5 min on one core
    python3 benchmarks/wire_formats.py --steps 10 --skip-sim   # smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the hand-made toy plans

import torch

from skippipe.cluster import load_cluster
from skippipe.costs import activation_bytes
from skippipe.data.dataset import token_data_for
from skippipe.eval import validation_loss
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.runtime.wire import ErrorFeedback, decode, round_trip
from skippipe.sim import simulate
from skippipe.train.config import TrainConfig
from skippipe.train.executor import ReferenceExecutor, plan_batch_fn
from skippipe.train.ops import backward_op, forward_op, loss_op
from skippipe.workload import Workload
from toy_plans import skip_plan

FORMATS = ("fp32", "bf16", "int8")


def simulated(seed: int, time_limit_s: float) -> dict[str, tuple[float, int]]:
    cluster = load_cluster("gcp-2025/geo-distributed/20")
    out = {}
    for wire in FORMATS:
        w = Workload(wire_format=wire)
        plan = make_plan("skippipe", build_problem(cluster, w), seed=seed, time_limit_s=time_limit_s)
        out[wire] = (simulate(plan, bound=False).makespan_s, activation_bytes(w.d_model, w.ctx, w.samples_per_microbatch, wire))
    return out


class WireExecutor(ReferenceExecutor):
    """The reference executor with every hop between two nodes sent in a wire format."""

    def __init__(self, *args, wire: str = "fp32", feedback: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.wire = wire
        self.fb = ErrorFeedback(wire) if feedback else None

    def send(self, key: tuple, t: torch.Tensor) -> torch.Tensor:
        if self.fb is None:
            return round_trip(t, self.wire)
        return decode(self.fb.encode(key, t), self.wire, list(t.shape)).to(t.dtype)

    def run_microbatch(self, mb_id: int, x: torch.Tensor, y: torch.Tensor) -> float:
        mb = self.plan.microbatch(mb_id)
        saved = [forward_op(self.copies[mb.data_node], x)]
        for i, node in enumerate(mb.path):
            saved.append(forward_op(self.copies[node], self.send(("F", mb_id, i), saved[-1].output)))
        h = self.send(("F", mb_id, len(mb.path)), saved[-1].output)
        loss, grad = loss_op(self.copies[mb.data_node], h, y)
        for i, s in enumerate(reversed(saved)):
            grad = backward_op(s, self.send(("B", mb_id, i), grad))  # type: ignore[arg-type]
            if grad is None:
                break
        return loss


def converge(wire: str, feedback: bool, args: argparse.Namespace) -> tuple[float, float]:
    cfg = TrainConfig(
        model={"preset": "tiny", "n_layers": 8, "ctx": args.seq_len, "d_model": 128}, vocab_size=2048,
        seq_len=args.seq_len, samples_per_microbatch=4, steps=args.steps, lr=2e-3, min_lr=2e-4,
        warmup_steps=max(1, args.steps // 10), seed=0,
    )
    data = token_data_for(cfg)
    model_cfg = cfg.model_config(data.vocab_size)
    plan = skip_plan([3, 2, 2, 2], 3, 4, 8, seed=0, samples=4, ctx=args.seq_len)
    torch.manual_seed(0)
    ex = WireExecutor(plan, model_cfg, cfg, plan_batch_fn(plan, data.train, cfg, args.seq_len), wire=wire, feedback=feedback)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        ex.step()
    return validation_loss(ex.full_model(), data.val, args.seq_len, 64, 8), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--time-limit", type=float, default=10.0, help="planner seconds per format")
    ap.add_argument("--skip-sim", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if not args.skip_sim:
        sim = simulated(0, args.time_limit)
        base = sim["fp32"][0]
        print("| wire | bytes per hop | simulated iteration (s) | vs fp32 |")
        print("|---|---:|---:|---:|")
        for wire, (t, nbytes) in sim.items():
            print(f"| {wire} | {nbytes / 2**20:,.1f} MiB | {t:,.2f} | {t / base:.3f} |")
    runs = [("fp32", False), ("bf16", False), ("int8", False), ("int8", True)]
    losses = {}
    for wire, fb in runs:
        name = wire + (" + error feedback" if fb else "")
        losses[name] = converge(wire, fb, args)
    base = losses["fp32"][0]
    print(f"\n| wire | final validation loss ({args.steps} steps) | vs fp32 |")
    print("|---|---:|---:|")
    for name, (loss, _) in losses.items():
        print(f"| {name} | {loss:.4f} | {loss / base:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
