"""``skippipe hdee train | eval | generate`` end to end on a tiny CPU config, and their one-line errors."""

from __future__ import annotations

import json

import pytest

from hdee_fixtures import write_config
from skippipe.cli import main


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_train_stop_resume_eval_generate(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path)
    assert main(["hdee", "train", str(config), "--until", "3"]) == 0
    out = capsys.readouterr().out
    assert "stopped early" in out and "stopped at step 3/8" in out
    assert not (tmp_path / "run" / "plan.json").exists()  # the seed models stopped: nothing after them ran

    assert main(["hdee", "train", str(config)]) == 0
    out = capsys.readouterr().out
    assert "[seed M] resuming at step 3/8" in out
    assert "difficulty manual: red easy (-1.00), blue moderate (+0.00), green hard (+1.00)" in out
    assert "difficulty seed-loss:" in out and "difficulty probe:" in out
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    names = [c["name"] for c in plan["configurations"]]
    assert names[0] == "homogeneous" and {"steps/manual", "size/seed-loss", "both/probe"} <= set(names) and len(names) == 10
    budget = plan["budget_flops"]
    for c in plan["configurations"]:  # every configuration on the homogeneous budget, within the tolerance
        assert abs(c["flops"] - budget) / budget <= 0.1
        assert c["flops"] == sum(e["flops"] for e in c["experts"])
    assert "homogeneous" in out and "vs budget" in out
    for name in plan["experts"]:
        assert f"[expert {name}] done" in out
    # a second call finds every expert finished and trains nothing
    assert main(["hdee", "train", str(config)]) == 0
    assert "step 4/" not in capsys.readouterr().out

    chart = tmp_path / "chart.png"
    assert main(["hdee", "eval", "run", "--chart", str(chart)]) == 0
    out = capsys.readouterr().out
    assert "ensemble, prior fitted on validation" in out and "the domain's own expert" in out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    assert set(results["domains"]) == {"red", "blue", "green", "gold", "grey"}
    assert results["domains"]["gold"]["role"] == "eval"
    for c in results["configurations"].values():
        for domain, row in c["domains"].items():
            assert sum(row["prior"].values()) == pytest.approx(1.0)
            assert (row["oracle"] is None) == (results["domains"][domain]["role"] == "eval")
            assert row["best_single_expert"] in c["experts"]
    # every expert alone on every domain, so the table can show them
    assert all(set(per) == set(results["domains"]) for per in results["experts"].values())

    assert main(["hdee", "generate", "run", "--configuration", "steps/manual", "--prompt", "re", "--tokens", "12",
                 "--prior", "red"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("re") and "posterior after the prompt" in out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["hdee", "train", "{tmp}/missing.toml"], "missing.toml"),
        (["hdee", "train", "{tmp}/bad.toml"], "bad.toml"),
        (["hdee", "train", "{tmp}/hdee.toml", "--until", "0"], "--until must be at least 1"),
        (["hdee", "eval", "{tmp}/nowhere"], "run `skippipe hdee train`"),
        (["hdee", "generate", "{tmp}/nowhere"], "run `skippipe hdee train`"),
    ],
)
def test_bad_input_is_one_line(argv, fragment, tmp_path, capsys):
    write_config(tmp_path)
    (tmp_path / "bad.toml").write_text("[run\nseed = 1\n")
    err = _one_line_error(capsys, main([a.format(tmp=tmp_path) for a in argv]))
    assert fragment in err


def test_unknown_configuration_and_prior_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(
        tmp_path, seed_model="steps = 0", train="steps = 2\nbatch_size = 2\nwarmup_steps = 1",
        ensemble='configurations = ["homogeneous"]\ndifficulty = []\neval_windows = 2\nprior_windows = 2',
    )
    assert main(["hdee", "train", str(config)]) == 0
    capsys.readouterr()
    err = _one_line_error(capsys, main(["hdee", "generate", "run", "--configuration", "size/manual"]))
    assert "no configuration 'size/manual'" in err and "homogeneous" in err
    err = _one_line_error(capsys, main(["hdee", "generate", "run", "--prior", "red"]))
    assert "run `skippipe hdee eval" in err
    err = _one_line_error(capsys, main(["hdee", "eval", "run", "--chart", str(tmp_path / "chart.svg")]))
    assert "PNG" in err
