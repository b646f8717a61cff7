"""HDEE result tables over seeds: mean and spread, experts matched across seeds, wins."""

from __future__ import annotations

import math

import pytest

from skippipe.hdee.report import experts_table, markdown_table, summarise, wins


def _run(loss: float, measured_steps: int) -> dict:
    """A results.json-shaped dict: two domains, a homogeneous and a measured configuration."""
    measured = f"a-M-{measured_steps}"
    experts = {"a-M-10": {"a": loss, "b": 3.0}, "b-M-10": {"a": 3.0, "b": loss}, measured: {"a": loss - 0.5, "b": 3.2}}

    def row(v: float) -> dict:
        return {"val_prior": v, "uniform": v + 0.1, "best_single": v + 0.2, "oracle": v + 0.3}

    return {
        "domains": {"a": {"role": "train"}, "b": {"role": "eval"}},
        "experts": experts,
        "configurations": {
            "homogeneous": {"experts": ["a-M-10", "b-M-10"], "domains": {"a": row(loss), "b": row(loss)}},
            "steps/seed-loss": {"experts": [measured, "b-M-10"], "domains": {"a": row(loss - 0.5), "b": row(loss + 0.1)}},
        },
    }


def test_mean_and_spread_over_seeds_in_perplexity():
    s = summarise([_run(1.0, 12), _run(2.0, 11)])
    mean, std, n = s["ppl"]["val_prior"]["homogeneous"]["a"]
    assert n == 2 and mean == pytest.approx((math.e + math.e**2) / 2)
    assert std == pytest.approx(abs(math.e**2 - math.e) / math.sqrt(2))
    table = markdown_table(s, "val_prior")
    assert "| a | train |" in table and "| b | held out |" in table and "±" in table
    assert wins(s) == {"a": "steps/seed-loss", "b": "homogeneous"}


def test_an_expert_with_other_steps_in_another_seed_is_one_row():
    s = summarise([_run(1.0, 12), _run(2.0, 11)])
    assert set(s["experts"]) == {"a-M-10", "b-M-10", "a-M-12/11 (steps/seed-loss)"}
    assert all(stat[2] == 2 for row in s["experts"].values() for stat in row.values())
    assert "a-M-12/11 (steps/seed-loss)" in experts_table(s)
    same = summarise([_run(1.0, 12), _run(2.0, 12)])
    assert "a-M-12" in same["experts"]
