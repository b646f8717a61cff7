"""The adversarial planning benchmark (``benchmarks/planner_fuzz.py``): its checks pass on a
real case and catch what they are for."""

from __future__ import annotations

import dataclasses

from bench_scripts import load_benchmark
from skippipe.errors import UserError
from skippipe.planner.methods import make_plan

fuzz = load_benchmark("planner_fuzz")


def test_a_drawn_case_plans_and_passes_every_check():
    text, problem = fuzz.case(1019)  # 15 nodes, S = L = 2, one microbatch per data node
    assert "N=15 S=2 L=2 m=1" in text
    for method in fuzz.METHODS:
        span, failed, seconds, why = fuzz.checked(method, problem, 0, timeout=120)
        assert span is not None and span > 0 and failed == [] and why == ""


def test_the_checks_catch_a_crash_a_wrong_prediction_and_a_long_refusal(monkeypatch):
    _, problem = fuzz.case(1019)

    def crash(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(fuzz, "make_plan", crash)
    assert fuzz.checked("naive", problem, 0, timeout=60)[1] == ["RecursionError: maximum recursion depth exceeded"]

    def wrong(method, problem, seed=0):
        plan = make_plan(method, problem, seed=seed)
        return dataclasses.replace(plan, predicted_makespan_s=plan.predicted_makespan_s * 0.5)

    monkeypatch.setattr(fuzz, "make_plan", wrong)
    assert any(f.startswith("simulated") for f in fuzz.checked("naive", problem, 0, timeout=60)[1])

    def refuse(*args, **kwargs):
        raise UserError("first line\nsecond line")

    monkeypatch.setattr(fuzz, "make_plan", refuse)
    span, failed, _, why = fuzz.checked("naive", problem, 0, timeout=60)
    assert span is None and why == "first line" and failed[0].startswith("a refusal of more than one line")
