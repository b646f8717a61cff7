"""``benchmarks/scheduler_suite.py --merge``: rows run again replace only the figures they carry."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "scheduler_suite.py"


def _suite_module():
    spec = importlib.util.spec_from_file_location("scheduler_suite_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_merge_keeps_other_rows_and_the_methods_not_run() -> None:
    merged = _suite_module().merged
    row = {"kind": "k", "S": 4, "L": 3}
    old = [{**row, "N": 12, "naive": 70.0, "skippipe": 60.0}, {**row, "N": 100, "naive": 90.0, "skippipe": 80.0}]
    new = [{**row, "N": 100, "skippipe": 75.0}, {**row, "N": 1000, "skippipe": 99.0}]
    out = merged(old, new)
    assert [r["N"] for r in out] == [12, 100, 1000]
    assert out[0] == old[0]
    assert out[1] == {**row, "N": 100, "naive": 90.0, "skippipe": 75.0}
    assert out[2] == new[1]
    assert merged([], new) == new
