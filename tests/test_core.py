"""Core types: clusters, workload, plan files (round trip, atomic writes, validation)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from skippipe.cluster import cluster_from_dict, load_cluster, preset_cluster
from skippipe.errors import ClusterError, PlanError, UserError
from skippipe.planfile import Microbatch, Plan, load_plan, path_rule_violation, plan_violations, save_plan
from skippipe.planner.problem import build_problem
from skippipe.workload import Workload


def test_planning_imports_without_torch():
    code = "import sys, skippipe.cluster, skippipe.planner.problem, skippipe.planfile; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_preset_round_robin_and_same_location_cost():
    c = preset_cluster("gcp-2025", "geo-distributed", 20)
    assert c.locations[:2] == ["Belgium", "Canada"] and c.locations[12] == "Belgium"
    p = build_problem(c, Workload())
    # same location: 1 ms + 32 MiB / 2 GiB/s + 0.35 s overhead
    assert p.transfer_s[0, 12] == pytest.approx(0.001 + 4 * 1024 * 1024 * 8 / (2 * 1024**3) + 0.35)
    assert p.stage_sizes == [5, 3, 3, 3, 3, 3]
    assert np.allclose(p.forward_s, 0.055 * 4 * 8)


def test_preset_matches_shipped_reference_delays():
    ref = load_cluster("gcp20-shipped")
    p = build_problem(preset_cluster("gcp-2025", "geo-distributed", 20), Workload())
    assert np.allclose(p.transfer_s, ref.transfer_s, rtol=1e-3)


def test_aws_missing_links_are_estimated():
    c = preset_cluster("aws-2022", "geo-distributed", 11)
    assert np.all(np.isfinite(c.latency_ms)) and np.all(c.bandwidth_GBps > 0)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"locations": ["Mars", "Belgium"]}, "unknown location"),
        ({"transfer_s": [[0, 1], [1]]}, "square"),
        ({"transfer_s": [[0, -1], [1, 0]]}, "negative"),
        ({"latency_ms": [[0, 1], [1, 0]]}, "bandwidth_GBps"),
        ({"transfer_s": [[0, 1], [1, 0]], "memory": [0, 3]}, "memory"),
        ({"transfer_s": [[0, 1], [1, 0]], "stages": [[0], [0]]}, "more than one stage"),
        ({}, "needs one of"),
    ],
)
def test_bad_cluster_files(data, message):
    with pytest.raises(ClusterError, match=message):
        cluster_from_dict(data)


def test_bad_workloads():
    with pytest.raises(UserError, match="path_length"):
        Workload(num_stages=4, path_length=5)
    with pytest.raises(UserError, match="add up"):
        Workload(stage_sizes=(5, 3, 3, 3, 3, 2)).sizes_for(20)


def _tiny_plan() -> Plan:
    c = cluster_from_dict({"transfer_s": np.ones((6, 6)).tolist(), "forward_s": 1.0})
    w = Workload(num_stages=3, path_length=2, microbatches_per_data_node=2, n_layers=3, memory=2, stage_sizes=(2, 2, 2))
    p = build_problem(c, w)
    stages = [[0, 1], [2, 3], [4, 5]]
    mbs = [Microbatch(0, 0, [2]), Microbatch(1, 0, [4]), Microbatch(2, 1, [3]), Microbatch(3, 1, [5])]
    return p.make_plan(stages, mbs, method="test", seed=0)


def test_plan_round_trip_and_atomic_save(tmp_path):
    plan = _tiny_plan()
    assert plan_violations(plan) == []
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    again = load_plan(path)
    assert again.to_dict() == plan.to_dict()
    # a bad plan is refused and the good file stays as it was
    plan.microbatches[0].path = [2, 4]
    with pytest.raises(PlanError, match="CC2"):
        save_plan(plan, path)
    assert load_plan(path).to_dict() == again.to_dict()
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_truncated_plan_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_tiny_plan().to_dict())[:200])
    with pytest.raises(PlanError, match="not valid JSON"):
        load_plan(path)


@pytest.mark.parametrize(
    "stages, ok",
    [
        ([1, 2, 3], True),
        ([2, 1, 3], True),  # one adjacent swap
        ([1, 3, 2], True),
        ([3, 1], False),  # swap of distance 2
        ([2, 1, 4, 3], False),  # two swaps with max_swaps=1
        ([1, 1], False),
        ([4], True),  # 4 stages past the frontier 0 (3 skipped)
        ([5], False),  # 5 > max_jump stages past the frontier: 0 -> 5 is forbidden
        ([2, 1, 5], True),  # 5 - 2 = 3 past the frontier 2
        ([1, 6], False),  # 6 - 1 = 5 > max_jump
    ],
)
def test_path_rules(stages, ok):
    assert (path_rule_violation(stages, max_swaps=1, max_jump=4) is None) == ok


def test_validator_catches_load_and_data_node():
    plan = _tiny_plan()
    plan.constraints.max_load = [2, 2, 1, 1, 1, 1]
    plan.microbatches[1].path = [2]
    assert any("TC1" in v for v in plan_violations(plan))
    plan = _tiny_plan()
    plan.microbatches[0].data_node = 3
    assert any("CC1" in v for v in plan_violations(plan))
