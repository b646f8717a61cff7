"""`skippipe simulate`: table, JSON, Gantt chart, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from skippipe.cli import main
from skippipe.planfile import Constraints, Costs, Microbatch, Plan, save_plan
from skippipe.reference import reference_plan
from skippipe.sim import simulate


@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "shipped-ca.json"
    save_plan(reference_plan("shipped", "ca"), path)
    return path


def test_table(plan_file, capsys):
    assert main(["simulate", str(plan_file)]) == 0
    out = capsys.readouterr().out
    expect = simulate(reference_plan("shipped", "ca"))
    assert f"makespan      {expect.makespan_s:.2f} s" in out
    assert f"lower bound   {expect.lower_bound_s:.2f} s" in out
    assert f"ratio         {expect.makespan_s / expect.lower_bound_s:.3f}" in out
    assert len([ln for ln in out.splitlines() if ln.strip()[:1].isdigit()]) == 20  # one row per node


def test_json_and_gantt(plan_file, tmp_path, capsys):
    png = tmp_path / "out" / "gantt.png"
    assert main(["simulate", str(plan_file), "--json", "--gantt", str(png)]) == 0
    doc = json.loads(capsys.readouterr().out)
    expect = simulate(reference_plan("shipped", "ca"))
    assert doc["makespan_s"] == pytest.approx(expect.makespan_s, abs=1e-4)
    assert doc["lower_bound_s"] == pytest.approx(expect.lower_bound_s, abs=1e-4)
    assert doc["finished"] is True and doc["unfinished"] == []
    node0 = doc["nodes"][0]
    assert node0["ops"] == 18 and {iv["kind"] for iv in node0["intervals"]} == {"F", "L", "B"}
    ends = [iv["end"] for row in doc["nodes"] for iv in row["intervals"]]
    assert max(ends) == pytest.approx(doc["makespan_s"], abs=1e-3)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _deadlock_plan(tmp_path):
    t = np.ones((4, 4)) - np.eye(4)
    plan = Plan(
        stages=[[0, 1], [2], [3]], layers=[[0], [1], [2]], memory=[3, 3, 1, 1],
        constraints=Constraints(path_length=3, max_swaps=1, max_jump=4),
        costs=Costs(transfer_s=t, forward_s=np.ones(4)),
        microbatches=[Microbatch(0, 0, [2, 3]), Microbatch(1, 1, [3, 2])],
    )
    path = tmp_path / "deadlock.json"
    save_plan(plan, path)
    return path


def test_deadlock_exit_code_and_json_null(tmp_path, capsys):
    path = _deadlock_plan(tmp_path)
    assert main(["simulate", str(path)]) == 1
    assert "did not finish" in capsys.readouterr().out
    assert main(["simulate", str(path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)  # strict JSON: no Infinity
    assert doc["makespan_s"] is None and doc["unfinished"] == [0, 1]


def test_fifo_ignores_processing_order(tmp_path, capsys):
    plan = reference_plan("shipped", "ca")
    order = simulate(plan).processing_order()
    assert order[0][:2] == ["F0", "F2"]
    order[0][:2] = ["F2", "F0"]  # inject the second copy first
    plan.processing_order = order
    path = tmp_path / "ordered.json"
    save_plan(plan, path)
    assert main(["simulate", str(path), "--json"]) == 0
    ordered = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(path), "--json", "--fifo"]) == 0
    fifo = json.loads(capsys.readouterr().out)
    assert [iv["mb"] for iv in ordered["nodes"][0]["intervals"][:2]] == [2, 0]
    assert [iv["mb"] for iv in fifo["nodes"][0]["intervals"][:2]] == [0, 2]
    assert fifo["makespan_s"] == pytest.approx(simulate(reference_plan("shipped", "ca")).makespan_s, abs=1e-4)


@pytest.mark.parametrize(
    "content, extra, message",
    [
        (None, [], "no such plan file"),
        ('{"version": 1, "stages": [[0', [], "not valid JSON"),
        ('{"version": 1}', [], "missing required key"),
        ('{"transfer_s": [[0, 1], [1, 0]]}', [], "not a plan file (it has no format 'skippipe-plan')"),
        ("ok", ["--gantt", "chart.jpg"], "PNG"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path, plan_file, content, extra, message):
    if content == "ok":
        path = plan_file
    else:
        path = tmp_path / "plan.json"
        if content is not None:
            path.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "skippipe.cli", "simulate", str(path), *extra], capture_output=True, text=True
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "chart.jpg").exists()


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["microbatches"][0].update(release_s=1e300), "release_s is too large: 1e+300 (the limit is 1e+12)"),
        (lambda d: d.update(memory=10**12), "memory is too large: 1000000000000 (the limit is 2**31)"),
        (lambda d: d["costs"]["forward_s"].__setitem__(0, 1e13), "costs hold seconds above the limit of 1e+12"),
    ],
)
def test_plan_values_beyond_the_limits_are_refused(tmp_path, plan_file, capsys, edit, message):
    """A plan file is held to the same limits as config files (``skippipe.limits``): a value of
    1e300 seconds is a typo, not a makespan to print."""
    doc = json.loads(plan_file.read_text())
    edit(doc)
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_a_reader_that_goes_away_stops_it_quietly(plan_file):
    """`skippipe simulate plan.json | head -1`: no error line when the pipe closes early."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "skippipe.cli", "simulate", str(plan_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and err == ""


def test_round_trip_breakdown_adds_up(plan_file, capsys):
    """The mean round trip is its compute, hops and waiting; with no other traffic a lone
    microbatch waits only for the gaps after its operations."""
    assert main(["simulate", str(plan_file), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    trips = doc["round_trips"]
    assert trips["mean_s"] == pytest.approx(trips["compute_s"] + trips["hops_s"] + trips["waiting_s"], abs=1e-3)
    assert trips["compute_s"] > 0 and trips["hops_s"] > 0 and trips["waiting_s"] >= -1e-6
    assert trips["slowest_s"] >= trips["mean_s"]
    plan = reference_plan("shipped", "ca")
    plan.microbatches = plan.microbatches[:1]
    plan.processing_order = None
    lone = plan_file.parent / "lone.json"
    save_plan(plan, lone)
    assert main(["simulate", str(lone)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("round trips"))
    c = plan.costs
    mb = plan.microbatches[0]
    work = c.forward_s[mb.data_node] * c.own_factor + sum(c.forward_s[x] * c.visit_factor for x in mb.path)
    assert f"compute {work:.2f}" in line
    waiting = float(line.split("waiting ")[1].split()[0])
    assert 0 <= waiting <= 2 * len(mb.path) * max(c.op_gap_s, c.inject_gap_s) + 1e-6
