"""The heavy-workload planning-time benchmark (``benchmarks/planning_time_heavy.py``): its draws
stay in the ranges it states, and it counts the cases above the target."""

from __future__ import annotations

from types import SimpleNamespace

from bench_scripts import load_benchmark

heavy = load_benchmark("planning_time_heavy")


def test_the_draws_are_heavy_and_deterministic():
    for k in range(40):
        text, problem = heavy.heavy_case(k)
        w = problem.workload
        assert 32 <= problem.n <= 40 and 6 <= w.num_stages <= 9 and 4 <= w.path_length <= w.num_stages
        assert w.microbatches_per_data_node == 17 and f"N={problem.n} S={w.num_stages}" in text
        assert heavy.heavy_case(k)[0] == text


def test_it_counts_the_cases_above_the_target(monkeypatch, capsys):
    plan = SimpleNamespace(predicted_makespan_s=12.5, meta={"candidate": "balanced"})
    monkeypatch.setattr(heavy, "make_plan", lambda method, problem, seed=0: plan)
    assert heavy.main(["--first", "3", "--count", "2", "--target", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("12.50 s (balanced)") == 2 and "2 of 2 cases above 0 s of wall clock" in out
    assert out.startswith("reference: ") and "s for 300,000 heap pushes and pops" in out
    heavy.main(["--first", "3", "--count", "1", "--target", "1000"])
    assert "0 of 1 cases above 1000 s of wall clock; the most" in capsys.readouterr().out
