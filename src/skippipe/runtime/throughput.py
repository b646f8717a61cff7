"""Training throughput of a run: tokens per second, and an MFU-style utilisation on GPUs.

- ``tokens/s``: the tokens an iteration trains on (microbatches x samples x tokens per sample)
  over the mean iteration time of the steady iterations (all but the first).
- utilisation: the model FLOPs an iteration needs over the iteration time and the GPUs' peak.
  Model FLOPs count what the plan runs: every microbatch goes through stage 0's layers and the
  layers of the stages on its path (``costs.layer_flops``), plus the LM head; the backward costs
  twice the forward (3x in all); recomputation under activation checkpointing is not counted
  (the MFU convention). The peak is the GPU's dense bf16 tensor peak from ``PEAK_BF16_TFLOPS``
  (by device name), for fp32 runs too; an unknown GPU gets no utilisation figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from skippipe.costs import layer_flops
from skippipe.model.config import ModelConfig
from skippipe.planfile import Plan

# dense bf16 tensor-core peak per GPU, TFLOP/s (vendor data sheets; SXM parts where both exist)
PEAK_BF16_TFLOPS: dict[str, float] = {
    "H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 70.0, "A10": 125.0,
    "RTX 4090": 165.0, "V100": 125.0, "T4": 65.0,
}


def gpu_peak_tflops(device_name: str) -> float | None:
    """The peak of the first ``PEAK_BF16_TFLOPS`` entry whose key occurs in ``device_name``
    (longest keys first: ``A10G`` before ``A10``); None for an unknown GPU."""
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return PEAK_BF16_TFLOPS[key]
    return None


def iteration_flops(plan: Plan, model: ModelConfig, samples_per_microbatch: int, seq_len: int) -> float:
    """Model FLOPs (forward + backward) of one iteration of ``plan``."""
    per_layer = layer_flops(model.d_model, seq_len, model.ffn_dim)
    head = 2.0 * model.d_model * model.vocab_size * seq_len
    stage_of = plan.stage_of()
    total = 0.0
    for mb in plan.microbatches:
        layers = len(plan.layers[0]) + sum(len(plan.layers[stage_of[node]]) for node in mb.path)
        total += samples_per_microbatch * 3.0 * (layers * per_layer + head)
    return total


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: float
    flops_per_s: float
    gpu: str | None = None  # the GPU's name (None: a CPU run)
    gpus: int = 0
    utilisation: float | None = None  # of gpus x the GPU's bf16 peak; None on CPU or for an unknown GPU

    def format(self) -> str:
        line = f"{self.tokens_per_s:,.0f} tokens/s, {self.flops_per_s / 1e12:.3g} model TFLOP/s"
        if self.gpu is None:
            return line
        if self.utilisation is None:
            return f"{line} on {self.gpus} x {self.gpu} (no peak known for it: no utilisation)"
        return f"{line}, utilisation {100 * self.utilisation:.1f} % of {self.gpus} x {self.gpu} bf16 peak"


def peak_device_memory(device: Any) -> int:
    """Bytes the CUDA caching allocator held at most on ``device`` so far (tensors, not its cache); 0 off CUDA."""
    import torch

    device = torch.device(device)
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else 0


def measure(tokens_per_iteration: int, flops_per_iteration: float, mean_iter_s: float,
            gpu: str | None = None, gpus: int = 0) -> Throughput:
    if mean_iter_s <= 0:
        raise ValueError(f"mean iteration time must be > 0, got {mean_iter_s}")
    flops = flops_per_iteration / mean_iter_s
    peak = gpu_peak_tflops(gpu) if gpu is not None else None
    util = flops / (gpus * peak * 1e12) if peak is not None and gpus > 0 else None
    return Throughput(tokens_per_iteration / mean_iter_s, flops, gpu, gpus, util)
