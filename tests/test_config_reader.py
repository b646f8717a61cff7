"""The one typed config reader (skippipe.config_fields.read_dataclass) behind every config kind:
random bad values always give one typed, one-line error naming the key; defaults read back
unchanged; one source for workload defaults, method names and seeds; the CLI's exit code 2."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import types
import typing
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skippipe.cli import main
from skippipe.cluster import ClusterFile, cluster_from_dict, load_cluster
from skippipe.config_fields import check_fields, known_keys, read_config_file, read_dataclass, to_table
from skippipe.errors import ClusterError, ConfigError, PlanError, UserError, WorkloadError
from skippipe.model.config import ModelConfig, model_config_from_dict
from skippipe.planfile import load_plan
from skippipe.planner.methods import method_names
from skippipe.runtime.config import PlanSection, RunConfig, RunSection, RuntimeSection, load_run_config, run_config_from_dict
from skippipe.train.config import TrainConfig, train_config_from_dict
from skippipe.workload import TRAINING_SHAPE, PipelineShape, Workload, workload_from_dict

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------ bad values


def _non_integral_floats() -> st.SearchStrategy[float]:
    return st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not x.is_integer())


SCALARS_NOT_NUMBERS = st.one_of(
    st.booleans(), st.text(max_size=8), st.sampled_from(["0.4", "1", "nan", "inf", ""]),
    st.none(), st.just([]), st.just({}), st.just({"a": 1}), st.just([[1]]),
)
HUGE_INTS = st.one_of(st.integers(min_value=2**31 + 1), st.integers(max_value=-(2**31) - 1), st.just(10**4000))


def bad_values(hint: typing.Any) -> st.SearchStrategy[typing.Any]:
    """Values that no field of type ``hint`` takes, whatever its bounds."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        scalar = [a for a in options if typing.get_origin(a) not in (list, tuple)]
        listy = [a for a in options if typing.get_origin(a) in (list, tuple)]
        strategies = []
        if scalar:
            strategies.append(bad_values(scalar[0]).filter(lambda v: v is not None and not isinstance(v, list)))
        if listy:  # with a scalar beside the list, only lists are surely bad
            strategies.append(bad_values(listy[0]).filter(lambda v: v is not None and (not scalar or isinstance(v, list))))
        if not scalar:
            strategies.append(st.one_of(st.booleans(), st.integers(), st.text(max_size=4), st.just({})))
        return st.one_of(strategies)
    if origin is typing.Literal:
        return st.one_of(st.text(max_size=8).filter(lambda v: v not in args), st.integers(), st.booleans(), st.none())
    if origin in (list, tuple):
        element = bad_values(args[0])
        return st.one_of(
            st.booleans(), st.integers(), st.text(max_size=4), st.none(), st.just({}),
            st.tuples(st.lists(st.just(_good(args[0])), max_size=3), element, st.lists(st.just(_good(args[0])), max_size=3))
            .map(lambda t: [*t[0], t[1], *t[2]]),
        )
    if origin is dict:
        return st.one_of(st.integers(), st.text(max_size=4), st.booleans(), st.just([1]), st.none())
    if hint is bool:
        return st.one_of(st.integers(), st.floats(), st.text(max_size=4), st.none(), st.just([True]), st.just({}))
    if hint is int:
        integral_floats = st.floats(allow_nan=False).filter(float.is_integer)
        return st.one_of(SCALARS_NOT_NUMBERS, _non_integral_floats(), integral_floats, HUGE_INTS)
    if hint is float:
        return st.one_of(SCALARS_NOT_NUMBERS, st.sampled_from([math.nan, math.inf, -math.inf, 1e308 * 10]), st.just(10**400))
    if hint is str:
        return st.one_of(st.booleans(), st.integers(), st.floats(), st.none(), st.just(["a"]), st.just({}))
    if dataclasses.is_dataclass(hint):
        return st.one_of(st.integers(), st.booleans(), st.text(max_size=4), st.just([{}]), st.none())
    raise AssertionError(f"no bad values for {hint!r}")


def _good(hint: typing.Any) -> typing.Any:
    """A value a list of ``hint`` may hold beside a bad one."""
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)[0]
    if typing.get_origin(hint) in (list, tuple):
        return [_good(typing.get_args(hint)[0])]
    if dataclasses.is_dataclass(hint):  # a table of its defaults
        return to_table(hint())
    return {int: 1, float: 1.0, str: "a", bool: True}[hint]


def _hints(cls: type) -> dict[str, typing.Any]:
    """The keys of ``cls``'s table and their types (an inline field's keys in its place)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, typing.Any] = {}
    for f in dataclasses.fields(cls):
        out.update(_hints(hints[f.name]) if f.metadata.get("inline") else {f.name: hints[f.name]})
    return out


# config kind -> (reader(data), a valid table to spoil, the dataclass whose keys it reads)
KINDS: dict[str, tuple[typing.Callable[[dict], typing.Any], dict, type]] = {
    "cluster": (lambda d: cluster_from_dict(d, where="c.toml"), {"transfer_s": [[0, 1], [1, 0]]}, ClusterFile),
    "workload": (lambda d: workload_from_dict(d, where="w.toml [workload]"), {}, Workload),
    "model": (lambda d: model_config_from_dict(d, where="m.toml [model]"), {"preset": "tiny"}, ModelConfig),
    "train": (lambda d: train_config_from_dict(d, where="t.toml"), {}, TrainConfig),
    "run [run]": (lambda d: run_config_from_dict({"run": d}, where="r.toml"), {}, RunSection),
    "run [plan]": (lambda d: run_config_from_dict({"plan": d}, where="r.toml"), {}, PlanSection),
    "run [runtime]": (lambda d: run_config_from_dict({"runtime": d}, where="r.toml"), {}, RuntimeSection),
    "run [train]": (lambda d: run_config_from_dict({"train": d}, where="r.toml"), {}, TrainConfig),
    "run [model]": (lambda d: run_config_from_dict({"model": d}, where="r.toml"), {}, ModelConfig),
    "run": (lambda d: run_config_from_dict(d, where="r.toml"), {}, RunConfig),
}


# the error type of each kind: a file's own kind, ConfigError for the tables of a run config
ERRORS = {"cluster": ClusterError, "workload": WorkloadError}


def _assert_one_line_error(excinfo: pytest.ExceptionInfo, key: str, kind: str) -> None:
    exc = excinfo.value
    assert type(exc) is ERRORS.get(kind, ConfigError), type(exc)
    text = str(exc)
    assert "\n" not in text and "\r" not in text and text.strip() == text, text
    assert key in text, text
    assert len(text) < 1000


@pytest.mark.parametrize("kind", sorted(KINDS))
@SETTINGS
@given(data=st.data())
def test_bad_values_give_one_typed_one_line_error(kind, data):
    reader, valid, cls = KINDS[kind]
    hints = _hints(cls)
    key = data.draw(st.sampled_from(sorted(hints)), label="key")
    value = data.draw(bad_values(hints[key]), label="value")
    with pytest.raises(UserError) as excinfo:
        reader({**valid, key: value})
    _assert_one_line_error(excinfo, key, kind)


@pytest.mark.parametrize("kind", sorted(KINDS))
@SETTINGS
@given(data=st.data())
def test_unknown_keys_are_refused_with_the_known_ones(kind, data):
    reader, valid, cls = KINDS[kind]
    taken = {*_hints(cls), "preset", "train"}
    key = data.draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in taken))
    with pytest.raises(UserError) as excinfo:
        reader({**valid, key: 1})
    exc = excinfo.value
    assert type(exc) is ERRORS.get(kind, ConfigError) and exc.key == key
    assert "\n" not in str(exc) and "unknown" in str(exc) and "(known: " in str(exc)


@pytest.mark.parametrize("kind", sorted(KINDS))
@SETTINGS
@given(value=st.one_of(st.integers(), st.text(max_size=4), st.lists(st.integers(), max_size=2), st.booleans(), st.none()))
def test_a_table_that_is_not_a_table(kind, value):
    reader = KINDS[kind][0]
    with pytest.raises(UserError) as excinfo:
        reader(value)
    assert type(excinfo.value) is ERRORS.get(kind, ConfigError) and "\n" not in str(excinfo.value)


# ------------------------------------------------------------------------------ exact messages


def test_messages_name_file_table_and_key():
    with pytest.raises(ConfigError) as excinfo:
        workload_from_dict({"path_length": 1.5}, where="small.toml [workload]")
    assert str(excinfo.value) == "small.toml [workload]: path_length must be an integer, got 1.5"
    assert (excinfo.value.where, excinfo.value.key) == ("small.toml [workload]", "path_length")
    with pytest.raises(ClusterError, match=r"^c.toml: latency_ms\[0\]\[1\] must be a number, got '0.4'$"):
        cluster_from_dict({"latency_ms": [[0, "0.4"], [1, 0]], "bandwidth_GBps": [[1, 1], [1, 1]]}, where="c.toml")
    # a rule between fields, raised by __post_init__, lands in the file too
    with pytest.raises(ConfigError) as excinfo:
        run_config_from_dict({"plan": {"num_stages": 3, "path_length": 4}}, where="r.toml")
    assert str(excinfo.value).startswith("r.toml [plan]: path_length L=4") and excinfo.value.key == "path_length"


@pytest.mark.parametrize(
    "value", [True, 1.5, 3.0, "3", 2**31 + 1, 10**5000, None, [3], {"a": 3}],
    ids=["bool", "1.5", "3.0", "str", "2**31+1", "5000 digits", "null", "list", "table"],
)
def test_integers_are_strict(value):
    with pytest.raises(ConfigError) as excinfo:
        read_dataclass(Workload, {"num_stages": value}, "w")
    assert excinfo.value.key == "num_stages" and len(str(excinfo.value)) < 200


@pytest.mark.parametrize(
    "value", [True, "0.4", math.nan, math.inf, -math.inf, 10**400, None],
    ids=["bool", "str", "nan", "inf", "-inf", "10**400", "null"],
)
def test_floats_are_strict(value):
    with pytest.raises(ConfigError, match="lr"):
        read_dataclass(TrainConfig, {"lr": value}, "t")
    lr = read_dataclass(TrainConfig, {"lr": 1}, "t").lr
    assert lr == 1.0 and isinstance(lr, float)


def test_values_built_in_code_are_checked_the_same_way():
    with pytest.raises(ConfigError, match="^workload: num_stages must be an integer, got true$"):
        Workload(num_stages=True)
    with pytest.raises(ConfigError, match="^model: rope_theta must be a finite number"):
        ModelConfig(rope_theta=math.nan)
    with pytest.raises(ConfigError, match="^train: seed must not be negative"):
        TrainConfig(seed=-1)
    check_fields(Workload())


def test_files_with_overlong_numbers_or_deep_nesting(tmp_path):
    f = tmp_path / "c.json"
    f.write_text('{"n": ' + "1" * 5000 + "}")
    with pytest.raises(ClusterError, match="a number is too long"):
        read_config_file(f, error=ClusterError)
    f.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        read_config_file(f)
    t = tmp_path / "c.toml"
    t.write_text("transfer_s = [[0, 1e309], [1, 0]]\n")
    with pytest.raises(ClusterError, match=r"transfer_s\[0\]\[1\] must be a finite number, got inf"):
        load_cluster(str(t))


def test_a_folder_or_an_unreadable_file_is_one_typed_error(tmp_path, monkeypatch):
    folder = tmp_path / "cluster.json"
    folder.mkdir()
    with pytest.raises(ClusterError, match="a folder, not a cluster file"):
        load_cluster(str(folder))
    with pytest.raises(PlanError, match="a folder, not a plan file"):
        load_plan(folder)
    f = tmp_path / "c.json"
    f.write_text("{}")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(ClusterError, match=r"cannot read it \(Permission denied\)"):
        read_config_file(f, error=ClusterError)
    with pytest.raises(PlanError, match=r"cannot read it \(Permission denied\)"):
        load_plan(f)


def test_a_file_of_another_kind_is_named_as_such(tmp_path):
    """A plan file given where a cluster, workload or run config is expected says what it is;
    a cluster file given as a plan says that it is not one."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"format": "skippipe-plan", "version": 2, "stages": [[0], [1]]}))
    with pytest.raises(ClusterError, match="a skippipe-plan file, not a cluster file"):
        load_cluster(str(plan))
    with pytest.raises(ConfigError, match="a skippipe-plan file, not a config file"):
        load_run_config(plan)
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"transfer_s": [[0, 1], [1, 0]]}))
    assert load_cluster(str(cluster)).n == 2
    with pytest.raises(PlanError, match="not a plan file"):
        load_plan(cluster)


# ------------------------------------------------------------------------------ one source per fact


def test_defaults_read_back_unchanged():
    for cls in (Workload, PipelineShape, ModelConfig, TrainConfig, RunSection, PlanSection, RuntimeSection, RunConfig):
        assert read_dataclass(cls, to_table(cls()), "x") == cls(), cls
        assert read_dataclass(cls, {}, "x") == cls(), cls
    cfg = RunConfig()
    assert run_config_from_dict(cfg.to_dict()) == cfg
    assert TrainConfig().to_dict() == to_table(TrainConfig()) | {"cache_dir": None, "data": None}  # unset paths
    assert train_config_from_dict(TrainConfig().to_dict()) == TrainConfig()
    assert model_config_from_dict(ModelConfig().to_dict()) == ModelConfig()
    assert workload_from_dict(Workload().to_dict()) == Workload()


def test_shipped_configs_read_back_unchanged():
    from pathlib import Path

    cfg = load_run_config(Path(__file__).parent.parent / "examples" / "train-tiny.toml")
    assert cfg.with_overrides() == cfg
    assert cfg.plan.shape == TRAINING_SHAPE
    for name in ("gcp20-current", "gcp20-shipped-free"):
        c = load_cluster(name)
        again = cluster_from_dict(c.to_dict(), where=name)
        assert again.to_dict() == c.to_dict()
    preset = load_cluster("aws-2022/geo-distributed/7")
    assert cluster_from_dict(preset.to_dict()).to_dict() == preset.to_dict()


def test_training_pipeline_defaults_have_one_source():
    plan = RunConfig().plan
    assert plan.shape is TRAINING_SHAPE
    w = plan.workload(n_layers=8, d_model=64, ctx=32, samples=2)
    assert isinstance(w, Workload) and dataclasses.replace(w) == w
    shape_keys = [f.name for f in dataclasses.fields(PipelineShape)]
    assert {k: getattr(w, k) for k in shape_keys} == {k: getattr(TRAINING_SHAPE, k) for k in shape_keys}
    assert (w.n_layers, w.d_model, w.ctx, w.samples_per_microbatch) == (8, 64, 32, 2)
    # a Workload's pipeline defaults are the PipelineShape's: declared once
    assert {k: getattr(Workload(), k) for k in shape_keys} == {k: getattr(PipelineShape(), k) for k in shape_keys}
    assert set(known_keys(PlanSection)) >= set(shape_keys)


def test_plan_help_shows_the_workload_defaults(capsys):
    assert main(["plan", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    d = Workload()
    for default in (d.num_stages, d.path_length, d.microbatches_per_data_node, d.memory, d.n_layers, d.d_model):
        assert f"(default {default})" in text


def test_plan_methods_come_from_the_registry():
    for name in method_names():
        assert run_config_from_dict({"plan": {"method": name}}).plan.method == name
    with pytest.raises(ConfigError, match="method must be one of " + ", ".join(method_names())):
        run_config_from_dict({"plan": {"method": "best"}})


def test_stage_sizes_refuse_bools_everywhere():
    with pytest.raises(ConfigError, match=r"stage_sizes\[0\] must be an integer, got true"):
        workload_from_dict({"num_stages": 2, "path_length": 2, "n_layers": 2, "stage_sizes": [True, 1]})
    with pytest.raises(ConfigError, match=r"\[plan\]: stage_sizes\[0\] must be an integer, got true"):
        run_config_from_dict({"plan": {"num_stages": 2, "path_length": 2, "stage_sizes": [True, 1]}})
    plan = run_config_from_dict({"plan": {"num_stages": 2, "path_length": 2, "stage_sizes": [1, 1]}}).plan
    assert plan.shape.stage_sizes == (1, 1)


def test_t_layer_zero_and_negative_seeds_are_refused():
    with pytest.raises(ClusterError, match="^c.json: t_layer_s must be > 0"):
        cluster_from_dict({"locations": ["Belgium", "Canada"], "t_layer_s": 0}, where="c.json")
    assert cluster_from_dict({"locations": ["Belgium", "Canada"], "t_layer_s": 0.01}).t_layer_s == 0.01
    for reader, data in [
        (model_config_from_dict, {"seed": -1}),
        (train_config_from_dict, {"seed": -1}),
        (run_config_from_dict, {"plan": {"seed": -1}}),
    ]:
        with pytest.raises(ConfigError, match="seed must not be negative, got -1"):
            reader(data)


def test_cluster_vectors_and_shapes():
    c = cluster_from_dict({"transfer_s": np.ones((3, 3)).tolist(), "memory": 2, "compute_speed": [1, 2, 1.5]})
    assert c.memory.tolist() == [2, 2, 2] and c.compute_speed.tolist() == [1.0, 2.0, 1.5]
    for data, message in [
        ({"transfer_s": [[0, 1], [1, 0]], "memory": [2.0, 2]}, r"memory\[0\] must be an integer"),
        ({"transfer_s": [[0, 1], [1, 0]], "forward_s": [1, 1, 1]}, "one entry per node"),
        ({"transfer_s": [[0, 1], [1, 0]], "n": 3}, "n = 3 but the cluster has 2 nodes"),
        ({"transfer_s": [[0, 1], [1, 0]], "stages": [[0], []]}, r"stages\[1\] needs at least 1 entry"),
        ({"transfer_s": [[0, True], [1, 0]]}, r"transfer_s\[0\]\[1\] must be a number, got true"),
        ({"transfer_s": [0, 1]}, r"transfer_s\[0\] must be a list"),
    ]:
        with pytest.raises(ClusterError, match=message):
            cluster_from_dict(data)


# ------------------------------------------------------------------------------ the command line


def test_plan_with_a_bad_cluster_value_exits_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('transfer_s = [[0, "0.4"], [1, 0]]\n')
    out = tmp_path / "plan.json"
    assert main(["plan", "--cluster", str(bad), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err == f"skippipe plan: error: {bad}: transfer_s[0][1] must be a number, got '0.4'\n"
    assert not out.exists()


def test_plan_with_a_bad_workload_value_is_a_workload_error(tmp_path, capsys):
    wl = tmp_path / "small.toml"
    wl.write_text("[workload]\npath_length = 1.5\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--cluster", "gcp-2025/geo-distributed/20", "--workload", str(wl), "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"skippipe plan: error: {wl} [workload]: path_length must be an integer, got 1.5\n"
    from skippipe.commands.plan import workload_from_args

    for path in (wl, tmp_path / "missing.toml"):
        with pytest.raises(WorkloadError) as excinfo:
            workload_from_args(argparse.Namespace(workload=str(path)))
        assert not isinstance(excinfo.value, ClusterError)
    both = tmp_path / "w.json"
    both.write_text(json.dumps({"workload": {"num_stages": 6}, "extra": 1}))
    with pytest.raises(WorkloadError, match="unknown top-level key"):
        workload_from_args(argparse.Namespace(workload=str(both)))


def test_plan_refuses_a_negative_seed(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--cluster", "gcp-2025/geo-distributed/20", "--seed", "-1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--seed must be >= 0, got -1" in err and not out.exists()


def test_training_plans_with_the_deterministic_budget_by_default():
    from skippipe.runtime.config import load_default_run_config, run_config_from_dict

    assert load_default_run_config().plan.time_limit_s is None
    assert run_config_from_dict({"plan": {"time_limit_s": 5}}).plan.time_limit_s == 5.0


def test_plan_t_layer_s_sets_the_compute_the_run_plans_and_emulates():
    from skippipe.model.config import ModelConfig
    from skippipe.runtime.config import load_default_run_config, run_config_from_dict
    from skippipe.runtime.job import build_plan

    model = ModelConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=2, n_kv_heads=1, ffn_dim=64, ctx=16)
    base = {"plan": {"method": "full", "num_stages": 4, "path_length": 4}}
    scaled = build_plan(run_config_from_dict(base), model, 16)  # the tiny model's FLOPs: next to nothing
    given = build_plan(run_config_from_dict({"plan": {**base["plan"], "t_layer_s": 0.055}}), model, 16)
    assert float(given.costs.forward_s.min()) > 100 * float(scaled.costs.forward_s.max())
    assert load_default_run_config().plan.t_layer_s == 0.055  # the embedded run emulates reference-sized compute
