"""Tokens/s and MFU-style utilisation (``skippipe.runtime.throughput``)."""

from __future__ import annotations

import pytest

from runtime_fixtures import seven_node_plan
from skippipe.costs import layer_flops
from skippipe.model.config import ModelConfig
from skippipe.runtime.throughput import PEAK_BF16_TFLOPS, gpu_peak_tflops, iteration_flops, measure

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=64, ctx=16, seed=1)


def test_iteration_flops_counts_the_layers_each_microbatch_visits():
    plan = seven_node_plan()
    stage_of = plan.stage_of()
    per_layer, head = layer_flops(32, 16, 64), 2.0 * 32 * 64 * 16
    expected = 0.0
    for mb in plan.microbatches:
        layers = len(plan.layers[0]) + sum(len(plan.layers[stage_of[n]]) for n in mb.path)
        expected += 2 * 3 * (layers * per_layer + head)
    assert iteration_flops(plan, CFG, 2, 16) == pytest.approx(expected)
    full = len(plan.microbatches) * 2 * 3 * (4 * per_layer + head)  # every stage visited
    assert iteration_flops(plan, CFG, 2, 16) < full  # the plan skips stages


def test_gpu_peaks_by_name():
    assert gpu_peak_tflops("NVIDIA H100 80GB HBM3") == PEAK_BF16_TFLOPS["H100"]
    assert gpu_peak_tflops("NVIDIA A10G") == PEAK_BF16_TFLOPS["A10G"]  # not the A10's
    assert gpu_peak_tflops("NVIDIA A10") == PEAK_BF16_TFLOPS["A10"]
    assert gpu_peak_tflops("Some Future GPU") is None


def test_measure_tokens_per_s_and_utilisation():
    cpu = measure(4096, 2e12, 2.0)
    assert cpu.tokens_per_s == 2048 and cpu.flops_per_s == 1e12 and cpu.utilisation is None
    assert "2,048 tokens/s" in cpu.format() and "utilisation" not in cpu.format()
    gpu = measure(4096, 2 * 989e12, 2.0, "NVIDIA H100 80GB HBM3", 2)
    assert gpu.utilisation == pytest.approx(0.5)
    assert "utilisation 50.0 % of 2 x NVIDIA H100 80GB HBM3 bf16 peak" in gpu.format()
    assert "no utilisation" in measure(1, 1.0, 1.0, "Mystery", 1).format()
    with pytest.raises(ValueError):
        measure(1, 1.0, 0.0)


def test_peak_memory_is_recorded_and_reported():
    from pathlib import Path

    import torch

    from skippipe.runtime.job import Summary, format_summary
    from skippipe.runtime.metrics import IterationStats
    from skippipe.runtime.throughput import peak_device_memory

    assert peak_device_memory(torch.device("cpu")) == 0
    rec = IterationStats(3, 2.5, 1e-3, 0.7, 0.5, 0.4, 8, peak_memory_bytes=3 * 2**30).record(time_scale=0.1)
    assert rec["peak_memory_bytes"] == 3 * 2**30 and rec["makespan_plan_s"] == pytest.approx(4.0)
    summary = Summary(Path("run"), 3, 3.0, 2.5, 0.5, 4.0, None, 9.0, None, None, peak_memory_bytes=rec["peak_memory_bytes"])
    assert "peak memory     3.00 GiB on one GPU worker" in format_summary(summary, emulated=False, time_scale=1.0)
    summary.peak_memory_bytes = 0  # a CPU run: no line
    assert "peak memory" not in format_summary(summary, emulated=False, time_scale=1.0)
