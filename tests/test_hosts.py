"""The host file (``[runtime] hosts``): every bad case is one ``HostFileError`` line, and under
torchrun each (machine, local rank) runs the plan node the file gives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_fixtures import seven_node_plan, write_config
from skippipe.errors import HostFileError
from skippipe.runtime.config import load_run_config
from skippipe.runtime.hosts import Host, check_hosts, load_hosts, place, torchrun_placement

GOOD = """
[[host]]
name = "a"
gpus = 4
nodes = [0, 1, 2, 3]

[[host]]
name = "b"
gpus = 2
nodes = [4, 5, 6]
"""


def _write(tmp_path: Path, text: str, name: str = "hosts.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_a_good_file_places_every_worker(tmp_path):
    path = _write(tmp_path, GOOD)
    hosts = load_hosts(path)
    check_hosts(hosts, 7, str(path), cuda=True)
    got = [place(hosts, "h", g, 2, j, len(hosts[g].nodes)) for g in (0, 1) for j in range(len(hosts[g].nodes))]
    assert [p.node for p in got] == [0, 1, 2, 3, 4, 5, 6]
    assert [p.gpu for p in got] == [0, 1, 2, 3, 0, 1, 0]  # three workers share two GPUs on "b"
    assert [p.host for p in got] == ["a"] * 4 + ["b"] * 3
    env = {"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3"}
    assert torchrun_placement(hosts, "h", env).node == 6
    cpu = [Host("c", 0, (0, 1))]
    check_hosts(cpu, 2, "h")
    assert place(cpu, "h", 0, 1, 1, 2).gpu is None
    assert load_hosts(_write(tmp_path, json.dumps({"host": [{"name": "j", "gpus": 1, "nodes": [0]}]}), "h.json"))[0].nodes == (0,)


@pytest.mark.parametrize("text, message", [
    ("[[host]\nname=", "not valid TOML"),
    ("x = 1\n[[host]]\nname = 'a'\nnodes = [0]", "unknown key(s) x"),
    ("", "no [[host]] tables"),
    ("host = 3", "no [[host]] tables"),
    ("host = [3]", "must be a table"),
    ("[[host]]\nname = 'a'\nnodes = [0]\ncpus = 2", "unknown key(s) cpus"),
    ("[[host]]\nname = 'a'\nnodes = [0]\ngpus = 'two'", "gpus"),
    ("[[host]]\nname = 'a'\nnodes = [0]\ngpus = -1", "gpus"),
    ("[[host]]\nname = 'a'\nnodes = ['zero']", "nodes"),
])
def test_unreadable_files_are_one_line(tmp_path, text, message):
    with pytest.raises(HostFileError) as exc:
        load_hosts(_write(tmp_path, text))
    assert message in str(exc.value) and "\n" not in str(exc.value) and "hosts.toml" in str(exc.value)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(HostFileError, match="no such host file"):
        load_hosts(tmp_path / "nope.toml")


@pytest.mark.parametrize("hosts, cuda, message", [
    ([Host("", 1, (0, 1, 2))], False, "host 1 has no name"),
    ([Host("a", 1, (0, 1)), Host("a", 1, (2,))], False, "'a' appears twice"),
    ([Host("a", 1, (0, 1, 2)), Host("b", 1, ())], False, "'b' runs no plan nodes"),
    ([Host("a", 1, (0, 1, 2, 3))], False, "node 3 is not in the plan"),
    ([Host("a", 1, (0, -1, 2))], False, "node -1 is not in the plan"),
    ([Host("a", 1, (0, 1)), Host("b", 1, (1, 2))], False, "node 1 is placed on both 'a' and 'b'"),
    ([Host("a", 1, (0, 2))], False, "plan node(s) 1 are on no host"),
    ([Host("a", 0, (0, 1, 2))], True, "gpus = 0 but [runtime] device is CUDA"),
])
def test_bad_placements_are_refused(hosts, cuda, message):
    with pytest.raises(HostFileError) as exc:
        check_hosts(hosts, 3, "hosts.toml", cuda=cuda)
    assert message in str(exc.value) and str(exc.value).startswith("hosts.toml: ")


@pytest.mark.parametrize("env, message", [
    ({"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, "started 3 machine(s)"),
    ({"GROUP_RANK": "2", "GROUP_WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, "node rank 2 is outside"),
    ({"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, "--nproc-per-node=3"),
    ({"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2", "LOCAL_RANK": "4", "LOCAL_WORLD_SIZE": "4"}, "local rank 4 is outside"),
    ({"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "LOCAL_WORLD_SIZE"),
    ({"GROUP_RANK": "x", "GROUP_WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, "must be integers"),
])
def test_torchrun_mismatches_are_refused(tmp_path, env, message):
    hosts = load_hosts(_write(tmp_path, GOOD))
    with pytest.raises(HostFileError) as exc:
        torchrun_placement(hosts, "hosts.toml", env)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_the_config_finds_the_host_file_beside_it(tmp_path):
    cfg = load_run_config(write_config(tmp_path, seven_node_plan(), runtime={"hosts": "hosts.toml"}))
    assert cfg.runtime.hosts == str((tmp_path / "hosts.toml").resolve())


def test_a_worker_with_a_bad_host_file_stops_with_one_line(tmp_path):
    _write(tmp_path, GOOD.replace("[4, 5, 6]", "[4, 5]"))
    config = write_config(tmp_path, seven_node_plan(), runtime={"hosts": "hosts.toml"})
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "7", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "skippipe.cli", "worker", str(config)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "plan node(s) 6 are on no host" in lines[0], done.stderr
