"""``benchmarks/scheduler_suite.py --merge``: rows run again replace only the figures they carry."""

from __future__ import annotations

from bench_scripts import load_benchmark


def test_merge_keeps_other_rows_and_the_methods_not_run() -> None:
    merged = load_benchmark("scheduler_suite").merged
    row = {"kind": "k", "S": 4, "L": 3}
    old = [{**row, "N": 12, "naive": 70.0, "skippipe": 60.0}, {**row, "N": 100, "naive": 90.0, "skippipe": 80.0}]
    new = [{**row, "N": 100, "skippipe": 75.0}, {**row, "N": 1000, "skippipe": 99.0}]
    out = merged(old, new)
    assert [r["N"] for r in out] == [12, 100, 1000]
    assert out[0] == old[0]
    assert out[1] == {**row, "N": 100, "naive": 90.0, "skippipe": 75.0}
    assert out[2] == new[1]
    assert merged([], new) == new
