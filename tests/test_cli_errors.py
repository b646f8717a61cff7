"""Every failure of a command is one line on stderr and a non-zero exit, never a traceback; output
paths are checked before any work is done."""

from __future__ import annotations

import importlib

import pytest

from skippipe.cli import main


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int, expected_code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == expected_code
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["plan", "--cluster", "gcp20-shipped", "--out", "/proc/skippipe-test.json"], "cannot create the plan file"),
        (["plan", "--cluster", "gcp20-shipped", "--out", "{tmp}/folder.json"], "is a folder"),
        (["plan", "--cluster", "gcp20-shipped", "--out", "{file}/x.json"], "is not a folder"),
        (["compare", "--cluster", "gcp20-shipped", "--chart", "/proc/skippipe-test.png"], "cannot create the chart"),
        (["compare", "--cluster", "gcp20-shipped", "--out-dir", "{file}"], "is a file"),
    ],
)
def test_unwritable_outputs_are_refused_before_planning(argv, fragment, tmp_path, capsys, monkeypatch):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "folder.json").mkdir()
    argv = [a.format(tmp=tmp_path, file=tmp_path / "afile") for a in argv]
    planned = []
    methods = importlib.import_module("skippipe.planner.methods")
    monkeypatch.setattr(methods, "make_plan", lambda *a, **k: planned.append(a))
    err = _one_line_error(capsys, main(argv), 2)
    assert fragment in err
    assert planned == []  # refused before any planning


def test_unwritable_gantt_is_refused_before_simulating(tmp_path, capsys):
    assert main(["plan", "--cluster", "gcp20-shipped", "--out", str(tmp_path / "p.json")]) == 0
    capsys.readouterr()
    err = _one_line_error(capsys, main(["simulate", str(tmp_path / "p.json"), "--gantt", "/proc/x.png"]), 2)
    assert "cannot create the Gantt chart" in err


@pytest.mark.parametrize("exc", [ValueError("bad\nvalue"), TypeError("no"), RecursionError("deep"), OverflowError("big")])
def test_unexpected_errors_are_one_line(exc, capsys, monkeypatch):
    simulate = importlib.import_module("skippipe.commands.simulate")

    def boom(args):
        raise exc

    monkeypatch.setattr(simulate, "run", boom)
    err = _one_line_error(capsys, main(["simulate", "x.json"]), 1)
    assert type(exc).__name__ in err


def test_os_errors_are_one_line(capsys, monkeypatch):
    simulate = importlib.import_module("skippipe.commands.simulate")

    def full_disk(args):
        raise OSError(28, "No space left on device", "/data/plan.png")

    monkeypatch.setattr(simulate, "run", full_disk)
    err = _one_line_error(capsys, main(["simulate", "x.json"]), 2)
    assert "/data/plan.png: No space left on device" in err
