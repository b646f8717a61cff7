"""Every failure of a command is one line on stderr and a non-zero exit, never a traceback; output
paths are checked before any work is done."""

from __future__ import annotations

import importlib
import subprocess
import sys

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


@pytest.mark.parametrize("module, code, fragment", [
    ("torch", 2, "needs the package 'torch', which is not installed: pip install 'skippipe[train]'"),
    ("tokenizers.models", 2, "pip install 'skippipe[train]'"),
    ("tqdm", 2, "needs the package 'tqdm', which is not installed: reinstall skippipe with its dependencies"),
    ("skippipe.no_such_module", 1, "unexpected ModuleNotFoundError"),
    ("not_a_requirement", 1, "unexpected ModuleNotFoundError"),
])
def test_a_missing_package_is_one_line_naming_what_to_install(module, code, fragment, capsys, monkeypatch):
    simulate = importlib.import_module("skippipe.commands.simulate")

    def missing(args):
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    monkeypatch.setattr(simulate, "run", missing)
    assert fragment in _one_line_error(capsys, main(["simulate", "x.json"]), code)


def test_a_command_run_without_torch_says_which_extra_to_install(tmp_path):
    """The planning-only install (no ``[train]`` extra): ``export`` imports torch and fails in
    one line, before it writes anything."""
    script = ("import sys; sys.modules['torch'] = None\n"
              "from skippipe.cli import main\n"
              f"sys.exit(main(['export', 'nowhere', '--hf', {str(tmp_path / 'hf')!r}]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "skippipe export: error: this command needs the package 'torch', which is not installed: pip install 'skippipe[train]'"
    ]
    assert not (tmp_path / "hf").exists()


def _tiny_checkpoint(folder):
    from skippipe.model.checkpoint import save_checkpoint
    from skippipe.model.config import ModelConfig
    from skippipe.model.llama import Llama

    cfg = ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=32, ctx=8)
    save_checkpoint(folder, cfg, Llama(cfg).state_dict(), step=1, stage_layers=[[0], [1]])
    return folder


@pytest.mark.parametrize("name", ["/etc/passwd", "../../outside", "a/b.json", 7])
def test_a_checkpoint_cannot_name_files_outside_its_folder(name, tmp_path, capsys):
    import json

    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    meta = json.loads((ckpt / "config.json").read_text())
    meta["tokenizer"] = name
    (ckpt / "config.json").write_text(json.dumps(meta))
    err = _one_line_error(capsys, main(["export", str(ckpt), "--hf", str(tmp_path / "out")]), 2)
    assert "not a plain file name" in err
    assert not (tmp_path / "out").exists()


def test_a_mistyped_or_binary_checkpoint_config_is_one_line(tmp_path, capsys):
    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    (ckpt / "config.json").write_bytes(b"\xff\xfe\x00garbage")
    _one_line_error(capsys, main(["export", str(ckpt), "--hf", str(tmp_path / "out")]), 2)
    (ckpt / "config.json").write_text('{"format": "skippipe-checkpoint", "version": "1", "stage_layers": "x"}')
    _one_line_error(capsys, main(["export", str(ckpt), "--hf", str(tmp_path / "out")]), 2)


@pytest.mark.parametrize(
    "flags",
    [
        ["--seq-len", "-5"], ["--seq-len", "0"], ["--samples", "0"], ["--stages", "0"],
        ["--sweep", "--max-choices", "0"], ["--samples", "1e3"], ["--seq-len", "99999999999"],
    ],
)
def test_eval_refuses_impossible_numbers_before_any_work(flags, tmp_path, capsys):
    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    err = _one_line_error(capsys, main(["eval", str(ckpt), *flags]), 2)
    assert err.startswith("skippipe eval: error: argument")


def test_a_garbage_tokenizer_is_not_exported(tmp_path, capsys):
    import json

    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    (ckpt / "tok.json").write_text("this is not a tokenizer")
    meta = json.loads((ckpt / "config.json").read_text())
    meta["tokenizer"] = "tok.json"
    (ckpt / "config.json").write_text(json.dumps(meta))
    _one_line_error(capsys, main(["export", str(ckpt), "--hf", str(tmp_path / "out")]), 2)
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_whose_weights_do_not_match_its_config_is_one_line(tmp_path, capsys):
    import json

    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    meta = json.loads((ckpt / "config.json").read_text())
    meta["model"]["d_model"] = 32  # the weights are 16 wide
    (ckpt / "config.json").write_text(json.dumps(meta))
    _one_line_error(capsys, main(["eval", str(ckpt), "--samples", "2"]), 2)
    _one_line_error(capsys, main(["export", str(ckpt), "--hf", str(tmp_path / "out")]), 2)
    assert not (tmp_path / "out").exists()
