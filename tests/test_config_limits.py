"""Values no config may hold, each a one-line typed error before any work: non-finite and absurd
floats, node ids that are not integers, strings in matrices, t_layer_s = 0, negative seeds, deep
nesting, 5,000-digit integers and sizes beyond the limits of ``skippipe.limits``."""

from __future__ import annotations

import dataclasses
import json
import typing

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skippipe import limits
from skippipe.cli import main
from skippipe.cluster import Cluster, ClusterFile, cluster_from_dict, preset_cluster
from skippipe.config_fields import read_config_file, read_dataclass
from skippipe.errors import ClusterError, ConfigError, UserError, WorkloadError
from skippipe.model.config import ModelConfig, model_config_from_dict
from skippipe.planner.problem import build_problem
from skippipe.runtime.config import PlanSection, RuntimeSection, load_run_config
from skippipe.train.config import TrainConfig
from skippipe.workload import PipelineShape, Workload, workload_from_dict

PRESET = "gcp-2025/geo-distributed/20"


def _plan_fails(tmp_path, capsys, *args: str) -> str:
    """``skippipe plan ARGS`` exits 2 with one line on stderr and writes nothing; the line."""
    out = tmp_path / "plan.json"
    assert main(["plan", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and len(err) < 400, err
    assert not out.exists()
    return err


# ------------------------------------------------------------------------------ flags


@pytest.mark.parametrize(
    "args, message",
    [
        (["--microbatches", "100000000"], f"microbatches_per_data_node must be at most {limits.MAX_MICROBATCHES}, got 100000000"),
        (["--layers", "1000000000"], f"n_layers must be at most {limits.MAX_LAYERS}, got 1000000000"),
        (["--stages", "100000", "--path-length", "4"], f"num_stages must be at most {limits.MAX_STAGES}"),
        (["--d-model", str(2**30)], "d_model must be at most"),
        (["--samples", "0"], "samples_per_microbatch must be a positive integer, got 0"),
        (["--stage-sizes", "1,1,1,1,1,100000"], f"stage_sizes[5] must be at most {limits.MAX_NODES}"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--seed", str(2**40)], "--seed must be at most 2**31"),
        (["--time-limit", "inf"], "--time-limit must be > 0 seconds and finite, got inf"),
        (["--time-limit", "nan"], "--time-limit must be > 0 seconds and finite, got nan"),
    ],
    ids=["microbatches", "layers", "stages", "d-model", "samples", "stage-sizes", "seed<0", "seed huge", "inf", "nan"],
)
def test_absurd_flags_are_one_line(tmp_path, capsys, args, message):
    assert message in _plan_fails(tmp_path, capsys, "--cluster", PRESET, *args)


@pytest.mark.parametrize("n", ["100000", "1025", "9" * 5000, "1"])
def test_presets_are_bounded(tmp_path, capsys, n):
    err = _plan_fails(tmp_path, capsys, "--cluster", f"gcp-2025/geo-distributed/{n}")
    assert f"a cluster needs 2 to {limits.MAX_NODES} nodes" in err


def test_a_preset_of_the_largest_size_is_accepted():
    c = preset_cluster("gcp-2025", "geo-distributed", limits.MAX_NODES)
    assert c.n == limits.MAX_NODES and c.latency_ms.shape == (limits.MAX_NODES, limits.MAX_NODES)


def test_an_overlong_cluster_spec_is_one_line(tmp_path, capsys):
    err = _plan_fails(tmp_path, capsys, "--cluster", "gcp-2025/" + "x" * 5000 + "/3")
    assert "unknown setting 'xxxx" in err
    err = _plan_fails(tmp_path, capsys, "--cluster", "a" * (limits.MAX_CHARS + 1))
    assert f"more than the limit of {limits.MAX_CHARS}" in err


# ------------------------------------------------------------------------------ files


CLUSTER_VALUES = {
    "inf": ('{"transfer_s": [[0, Infinity], [1, 0]]}', "transfer_s[0][1] must be a finite number, got inf"),
    "nan": ('{"transfer_s": [[0, NaN], [1, 0]]}', "transfer_s[0][1] must be a finite number, got nan"),
    "1e308": ('{"transfer_s": [[0, 1e308], [1, 0]]}', "transfer_s[0][1] is too large: 1e+308 (the limit is 1e+12)"),
    "1e309": ('{"transfer_s": [[0, 1e309], [1, 0]]}', "transfer_s[0][1] must be a finite number, got inf"),
    "node id 1.5": ('{"transfer_s": [[0, 1], [1, 0]], "stages": [[0], [1.5]]}', "stages[1][0] must be an integer, got 1.5"),
    "node id true": ('{"transfer_s": [[0, 1], [1, 0]], "stages": [[0], [true]]}', "stages[1][0] must be an integer, got true"),
    "node id 5000": ('{"transfer_s": [[0, 1], [1, 0]], "stages": [[0], [5000]]}', f"must be at most {limits.MAX_NODES - 1}"),
    "string in matrix": (
        '{"latency_ms": [[0, "0.4"], [1, 0]], "bandwidth_GBps": [[1, 1], [1, 1]]}', "latency_ms[0][1] must be a number, got '0.4'"
    ),
    "t_layer_s 0": ('{"locations": ["Belgium", "Canada"], "t_layer_s": 0}', "t_layer_s must be > 0, got 0.0"),
    "n too large": ('{"transfer_s": [[0, 1], [1, 0]], "n": 100000}', f"n must be at most {limits.MAX_NODES}"),
    "5000 digits": ('{"n": ' + "1" * 5000 + "}", "not valid JSON: a number is too long"),
    "deep nesting": ("[" * 200_000 + "]" * 200_000, "not valid JSON: nested too deeply"),
    "tiny bandwidth": (
        '{"latency_ms": [[0, 1], [1, 0]], "bandwidth_GBps": [[1, 1e-300], [1e-300, 1]]}', "transfer times beyond 1e+12 s"
    ),
}


@pytest.mark.parametrize("name", sorted(CLUSTER_VALUES))
def test_bad_cluster_values_are_one_line(tmp_path, capsys, name):
    text, message = CLUSTER_VALUES[name]
    f = tmp_path / "c.json"
    f.write_text(text)
    err = _plan_fails(tmp_path, capsys, "--cluster", str(f), "--stages", "2", "--path-length", "2")
    assert err == f"skippipe plan: error: {f}: {message}\n" or message in err, err


def test_more_nodes_than_the_limit_in_a_matrix():
    side = limits.MAX_NODES + 1
    with pytest.raises(ClusterError, match=f"transfer_s has {side} entries, more than the limit of {limits.MAX_NODES}"):
        cluster_from_dict({"transfer_s": [[1.0]] * side})


@pytest.mark.parametrize(
    "suffix, text",
    [
        (".json", "[" * 200_000 + "]" * 200_000),
        (".json", '{"num_stages": ' + "9" * 5000 + "}"),
        (".toml", "num_stages = " + "9" * 5000 + "\n"),
        (".toml", "x = " + "[" * 100_000 + "]" * 100_000 + "\n"),
    ],
    ids=["json deep", "json digits", "toml digits", "toml deep"],
)
def test_unreadable_files_are_one_line_of_their_kind(tmp_path, suffix, text):
    f = tmp_path / f"f{suffix}"
    f.write_text(text)
    for error in (ConfigError, ClusterError, WorkloadError):
        with pytest.raises(error) as excinfo:
            read_config_file(f, error=error)
        assert type(excinfo.value) is error and "\n" not in str(excinfo.value) and len(str(excinfo.value)) < 300
    with pytest.raises(ConfigError, match="not valid TOML" if suffix == ".toml" else "not valid JSON"):
        load_run_config(f)


def test_a_bad_workload_file_is_a_workload_error(tmp_path, capsys):
    wl = tmp_path / "w.toml"
    wl.write_text("[workload]\nmicrobatches_per_data_node = 1e308\n")
    err = _plan_fails(tmp_path, capsys, "--cluster", PRESET, "--workload", str(wl))
    assert err == f"skippipe plan: error: {wl} [workload]: microbatches_per_data_node must be an integer, got 1e+308\n"
    with pytest.raises(WorkloadError, match="stage_sizes add up to 3 nodes but the cluster has 20"):
        Workload(num_stages=2, path_length=2, stage_sizes=(2, 1)).sizes_for(20)
    with pytest.raises(WorkloadError, match="cannot hold 6 stages"):
        Workload().sizes_for(4)
    with pytest.raises(WorkloadError, match="^workload: memory must be a positive integer, got 0$"):
        Workload(memory=0)


# ------------------------------------------------------------------------------ t_layer_s, seeds


def test_t_layer_s_is_honoured_or_refused_never_replaced():
    c = Cluster(name="c", n=6, transfer_s=np.ones((6, 6)), t_layer_s=0.01)
    problem = build_problem(c, Workload())
    assert problem.cost_model.t_layer_s == 0.01
    assert problem.forward_s[0] == pytest.approx(0.01 * 4 * 8)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ClusterError, match="t_layer_s must be > 0 and finite"):
            Cluster(name="c", n=6, transfer_s=np.ones((6, 6)), t_layer_s=bad)
    default = build_problem(Cluster(name="c", n=6, transfer_s=np.ones((6, 6))), Workload())
    assert default.cost_model.t_layer_s == 0.055


@pytest.mark.parametrize("cls", [ModelConfig, TrainConfig, PlanSection])
def test_negative_seeds_are_refused(cls):
    with pytest.raises(ConfigError, match="seed must not be negative, got -1"):
        cls(seed=-1)
    with pytest.raises(ConfigError, match="seed is too large"):
        read_dataclass(cls, {"seed": 2**31 + 1}, "x")


def test_a_model_beyond_the_parameter_limit():
    with pytest.raises(ConfigError, match="parameters, more than the limit of 1e\\+12"):
        model_config_from_dict({"n_layers": 10_000, "d_model": 65536, "n_heads": 64, "n_kv_heads": 64, "ffn_dim": 262144})


# ------------------------------------------------------------------------------ every limit, by property


def _bounded_fields() -> list[tuple[type, str, typing.Any, float]]:
    """(class, key, type, max) of every config field with an upper bound."""
    out = []
    for cls in (ClusterFile, PipelineShape, Workload, ModelConfig, TrainConfig, PlanSection, RuntimeSection):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if "max" in f.metadata:
                out.append((cls, f.name, hints[f.name], f.metadata["max"]))
    return out


BOUNDED = _bounded_fields()


def _inside_lists(hint: typing.Any, value: int) -> typing.Any:
    """``value`` as an entry of a field of type ``hint`` (``[[value]]`` for ``list[list[int]] | None``)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (list, tuple):
        return [_inside_lists(args[0], value)]
    if args and typing.get_origin(hint) is not typing.Literal:
        return _inside_lists(args[0], value)  # X | None
    return value


def test_the_limits_are_on_the_sizes():
    names = {(cls.__name__, key) for cls, key, _, _ in BOUNDED}
    for cls, key in [("ClusterFile", "n"), ("Workload", "num_stages"), ("Workload", "microbatches_per_data_node"),
                     ("Workload", "n_layers"), ("ModelConfig", "n_layers"), ("ModelConfig", "d_model"), ("Workload", "ctx")]:
        assert (cls, key) in names


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_value_beyond_a_limit_is_a_typed_one_line_error(data):
    cls, key, hint, most = data.draw(st.sampled_from(BOUNDED), label="field")
    value = data.draw(st.integers(min_value=int(most) + 1, max_value=limits.INT_LIMIT), label="value")
    value = _inside_lists(hint, value)
    with pytest.raises(UserError) as excinfo:
        read_dataclass(cls, {key: value}, "f.toml")
    exc = excinfo.value
    assert isinstance(exc, ConfigError) and exc.key == key and "\n" not in str(exc)
    assert f"must be at most {int(most)}" in str(exc)


def test_config_files_saved_by_runs_carry_the_same_limits(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"plan": {"microbatches_per_data_node": limits.MAX_MICROBATCHES + 1}}))
    with pytest.raises(ConfigError, match=rf"\[plan\]: microbatches_per_data_node must be at most {limits.MAX_MICROBATCHES}"):
        load_run_config(f)
    f.write_text(json.dumps({"plan": {"microbatches_per_data_node": limits.MAX_MICROBATCHES}}))
    assert load_run_config(f).plan.shape.microbatches_per_data_node == limits.MAX_MICROBATCHES


def test_a_workload_at_the_limits_is_accepted():
    w = workload_from_dict({"microbatches_per_data_node": limits.MAX_MICROBATCHES, "n_layers": limits.MAX_LAYERS})
    assert (w.microbatches_per_data_node, w.n_layers) == (limits.MAX_MICROBATCHES, limits.MAX_LAYERS)
