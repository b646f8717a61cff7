"""Without a profile, the planner's compute cost per layer scales with the model's FLOPs per layer."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skippipe.cluster import preset_cluster
from skippipe.costs import REFERENCE_CTX, REFERENCE_D_MODEL, CostModel, layer_flops, scaled_t_layer
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.workload import Workload


def test_reference_layer_keeps_the_table_constant():
    assert scaled_t_layer(0.055, REFERENCE_D_MODEL, REFERENCE_CTX) == pytest.approx(0.055)
    p = build_problem(preset_cluster("gcp-2025", "geo-distributed", 20), Workload())
    assert p.cost_model.t_layer_s == pytest.approx(0.055)


def test_layer_flops_counts_weights_and_attention():
    d, t = 64, 16
    weights = 4 * d * d + 3 * d * 4 * d  # q, k, v, o + gate, up, down (ffn = 4d)
    assert layer_flops(d, t) == pytest.approx(t * (2 * weights + 4 * t * d))
    assert layer_flops(d, t, ffn_dim=100) == pytest.approx(t * (2 * (4 * d * d + 3 * d * 100) + 4 * t * d))
    with pytest.raises(ValueError):
        layer_flops(0, 16)


@given(st.integers(8, 4096), st.integers(8, 4096), st.integers(1, 8))
def test_t_layer_grows_with_width_and_context(d, t, k):
    base = scaled_t_layer(0.05, d, t)
    assert scaled_t_layer(0.05, d * 2, t) > base
    assert scaled_t_layer(0.05, d, t * 2) > base
    assert scaled_t_layer(0.05 * k, d, t) == pytest.approx(k * base)


def test_a_500m_model_and_a_tiny_one_do_not_plan_alike():
    cluster = preset_cluster("gcp-2025", "geo-distributed", 12)
    shape = dict(num_stages=4, path_length=3, microbatches_per_data_node=4, n_layers=12, samples_per_microbatch=8)
    big = build_problem(cluster, Workload(d_model=1024, ctx=1024, **shape))
    tiny = build_problem(cluster, Workload(d_model=128, ctx=128, **shape))
    ratio = layer_flops(1024, 1024) / layer_flops(128, 128)
    assert np.allclose(big.forward_s / tiny.forward_s, ratio)
    assert ratio > 100
    big_plan = make_plan("skippipe", big, seed=0, time_limit_s=5)
    tiny_plan = make_plan("skippipe", tiny, seed=0, time_limit_s=5)
    # the tiny model's iteration is all network: far shorter than the big model's
    assert tiny_plan.predicted_makespan_s < 0.8 * big_plan.predicted_makespan_s
    assert np.allclose(tiny_plan.costs.forward_s, tiny.forward_s)


def test_an_explicit_cost_model_or_measured_forward_times_are_used_as_given():
    cluster = preset_cluster("gcp-2025", "geo-distributed", 12)
    w = Workload(num_stages=4, path_length=3, n_layers=12, d_model=128, ctx=128)
    assert build_problem(cluster, w, CostModel(t_layer_s=0.02)).cost_model.t_layer_s == 0.02
    cluster.forward_s = np.full(12, 0.7)
    assert np.allclose(build_problem(cluster, w).forward_s, 0.7)
