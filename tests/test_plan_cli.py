"""`skippipe plan` and `skippipe compare`: good runs, and bad input -> one line, exit 2, no file."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from skippipe.cli import main
from skippipe.planfile import load_plan
from skippipe.sim import simulate


def _write(path, text: str):
    path.write_text(text)
    return str(path)


def _cluster_file(tmp_path, data: dict, name: str = "cluster.json") -> str:
    return _write(tmp_path / name, json.dumps(data))


def _ones(n: int) -> list[list[float]]:
    return (np.ones((n, n)) - np.eye(n)).tolist()


def test_plan_full_writes_a_valid_plan(tmp_path, capsys):
    out = tmp_path / "plans" / "full.json"
    assert main(["plan", "--cluster", "gcp-2025/geo-distributed/20", "--method", "full", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    plan = load_plan(out)  # validates CC1-CC3 and TC1
    assert plan.method == "full" and len(plan.microbatches) == 30
    res = simulate(plan, record=False)
    assert plan.predicted_makespan_s == pytest.approx(res.makespan_s)
    assert f"makespan     {res.makespan_s:.2f} s" in text
    assert f"lower bound  {res.lower_bound_s:.2f} s" in text
    assert f"wrote        {out}" in text


def test_plan_workload_file_and_flags(tmp_path, capsys):
    wl = _write(tmp_path / "w.toml", "[workload]\nnum_stages = 4\npath_length = 3\nmicrobatches_per_data_node = 4\n")
    out = tmp_path / "p.json"
    code = main(["plan", "--cluster", "aws-2022/geo-distributed/12", "--workload", wl, "--memory", "2",
                 "--method", "random", "--seed", "3", "--out", str(out), "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    plan = load_plan(out)
    assert plan.num_stages == 4 and plan.constraints.path_length == 3 and set(plan.memory) == {2}
    assert doc["microbatches"] == len(plan.microbatches) == 4 * len(plan.stages[0])
    assert doc["makespan_s"] == pytest.approx(plan.predicted_makespan_s)
    assert doc["seed"] == 3 and doc["method"] == "random"


def test_plan_skippipe_no_tc2(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "--cluster", "gcp20-current", "--method", "skippipe-no-tc2", "--out", str(out)]) == 0
    plan = load_plan(out)
    assert plan.stages == [[0, 6, 13, 18, 19], [10, 8, 11], [17, 16, 1], [3, 5, 2], [14, 15, 9], [4, 7, 12]]
    assert plan.lower_bound_s <= plan.predicted_makespan_s


BAD_CLUSTERS = {
    "truncated JSON": ('{"transfer_s": [[0, 1], [1, 0]], "forward_s": [1', "not valid JSON"),
    "malformed JSON": ("{transfer_s: [[0, 1]]}", "not valid JSON"),
    "unknown location": (json.dumps({"locations": ["Belgium", "Mars"]}), "unknown location 'Mars'"),
    "non-square matrix": (json.dumps({"transfer_s": [[0, 1, 2], [1, 0, 2]]}), "square"),
    "negative matrix": (json.dumps({"transfer_s": [[0, -1], [1, 0]]}), "negative"),
    "negative latency": (json.dumps({"latency_ms": [[0, -5], [5, 0]], "bandwidth_GBps": [[1, 1], [1, 1]]}), "negative"),
    "stages do not cover the nodes": (
        json.dumps({"transfer_s": _ones(7), "stages": [[0, 1], [2, 3], [4, 5]]}), "stages hold 6 of its 7 nodes"),
    "memory too small": (json.dumps({"transfer_s": _ones(6), "memory": [3, 3, 0, 3, 3, 3]}), "memory"),
}


@pytest.mark.parametrize("case", sorted(BAD_CLUSTERS))
def test_bad_cluster_file(case, tmp_path, capsys):
    text, message = BAD_CLUSTERS[case]
    cluster = _write(tmp_path / "cluster.json", text)
    out = tmp_path / "plan.json"
    args = ["plan", "--cluster", cluster, "--method", "full", "--out", str(out)]
    if "stages" in case:
        args += ["--stages", "3", "--path-length", "2", "--layers", "3"]
    if "memory" in case:
        args += ["--stages", "3", "--path-length", "2", "--layers", "3"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("skippipe plan: error: ") and message in err
    assert not out.exists() and list(tmp_path.iterdir()) == [tmp_path / "cluster.json"]


BAD_FLAGS = {
    "unknown preset table": (["--cluster", "gcp-1999/geo-distributed/20"], "unknown network table"),
    "unknown preset setting": (["--cluster", "gcp-2025/moon-base/20"], "unknown setting"),
    "unknown cluster name": (["--cluster", "nowhere"], "unknown cluster"),
    "missing cluster file": (["--cluster", "missing.json"], "no such cluster file"),
    "cluster path is a folder": (["--cluster", "."], "a folder, not a cluster file"),
    "L larger than S": (["--cluster", "gcp-2025/geo-distributed/20", "--stages", "4", "--path-length", "5"], "path_length L=5"),
    "stage sizes do not add up": (
        ["--cluster", "gcp-2025/geo-distributed/20", "--stage-sizes", "5,3,3,3,3,2"],
        "add up to 19 nodes but the cluster has 20",
    ),
    "stage sizes not numbers": (["--cluster", "gcp-2025/geo-distributed/20", "--stage-sizes", "5,x"], "comma-separated"),
    "memory zero": (["--cluster", "gcp-2025/geo-distributed/20", "--memory", "0"], "memory M=0 is too small to make any plan"),
    "bad time limit": (["--cluster", "gcp-2025/geo-distributed/20", "--time-limit", "0"], "time-limit"),
    "too few nodes": (["--cluster", "gcp-2025/geo-distributed/4"], "cannot hold 6 stages"),
}


@pytest.mark.parametrize("case", sorted(BAD_FLAGS))
def test_bad_flags(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flags, message = BAD_FLAGS[case]
    out = tmp_path / "plan.json"
    assert main(["plan", *flags, "--method", "full", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert list(tmp_path.iterdir()) == []


def test_bad_workload_file(tmp_path, capsys):
    wl = _write(tmp_path / "w.toml", "num_stages = [oops\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--cluster", "gcp-2025/geo-distributed/20", "--workload", wl, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not valid TOML" in err
    assert not out.exists()
    wl = _write(tmp_path / "w.json", json.dumps({"num_stages": 6, "colour": "red"}))
    assert main(["plan", "--cluster", "gcp-2025/geo-distributed/20", "--workload", wl, "--out", str(out)]) == 2
    assert "unknown key(s) colour" in capsys.readouterr().err
    assert not out.exists()


def test_existing_plan_survives_a_failed_run(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--cluster", "gcp-2025/geo-distributed/20", "--method", "full", "--out", str(out)]) == 0
    before = out.read_text()
    assert main(["plan", "--cluster", "gcp-2025/geo-distributed/20", "--path-length", "9", "--out", str(out)]) == 2
    assert out.read_text() == before


def test_real_process_prints_one_line_and_exits_2(tmp_path):
    cluster = _write(tmp_path / "c.json", '{"transfer_s": [[0, 1], [1')
    out = tmp_path / "plan.json"
    proc = subprocess.run(
        [sys.executable, "-m", "skippipe.cli", "plan", "--cluster", cluster, "--out", str(out)],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not valid JSON" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == "" and not out.exists()


def test_compare_table_json_chart_and_plans(tmp_path, capsys):
    chart = tmp_path / "cmp.png"
    plans = tmp_path / "plans"
    args = ["compare", "--cluster", "gcp20-current", "--methods", "full,random,skippipe-no-tc2",
            "--chart", str(chart), "--out-dir", str(plans)]
    assert main(args + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["method"]: r for r in doc["results"]}
    assert list(rows) == ["full", "random", "skippipe-no-tc2"]
    for method, row in rows.items():
        plan = load_plan(plans / f"{method}.json")
        assert row["makespan_s"] == pytest.approx(simulate(plan, record=False).makespan_s)
        assert row["reduction_vs_full"] == pytest.approx(1 - row["makespan_s"] / rows["full"]["makespan_s"])
        assert row["ratio"] == pytest.approx(row["makespan_s"] / row["lower_bound_s"])
        assert plan.stages == rows["full"]["stages"]  # one shared allocation
    assert rows["skippipe-no-tc2"]["makespan_s"] < rows["full"]["makespan_s"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "method" in table and f"{rows['full']['makespan_s']:.2f}" in table


def test_compare_shares_one_allocation(tmp_path, capsys):
    assert main(["compare", "--cluster", "aws-2022/geo-distributed/14", "--methods", "random,full", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["allocation"] == "shared"
    assert doc["results"][0]["stages"] == doc["results"][1]["stages"]


def test_compare_bad_input(tmp_path, capsys):
    assert main(["compare", "--cluster", "gcp20-current", "--methods", "full,magic"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "unknown method(s) magic" in err
    chart = tmp_path / "c.jpg"
    assert main(["compare", "--cluster", "gcp20-current", "--methods", "full", "--chart", str(chart)]) == 2
    assert "PNG" in capsys.readouterr().err and not chart.exists()


def test_planning_commands_do_not_import_torch(tmp_path):
    code = (
        "import sys\n"
        "from skippipe.cli import main\n"
        f"assert main(['compare', '--cluster', 'gcp20-current', '--methods', 'full,random,skippipe-no-tc2', "
        f"'--chart', r'{tmp_path / 'c.png'}', '--out-dir', r'{tmp_path}']) == 0\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip().splitlines()[-1] == "False"
