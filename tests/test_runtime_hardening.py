"""Hardening without training: the launcher's verdict from typed fault records, message header
bounds, the rendezvous bound to its address, run folder ownership and lock, resume checks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from runtime_fixtures import seven_node_plan, write_config
from skippipe.cli import main
from skippipe.errors import BadMessage, MessageTimeout, PeerLost, ResumeMismatch, RunFolderError, RunLocked, TrainingDiverged
from skippipe.runtime.config import load_run_config
from skippipe.runtime.faults import Ended, FaultKind, WorkerStatus, status_of, verdict
from skippipe.runtime.job import check_resume_config
from skippipe.runtime.process_group import host_store
from skippipe.runtime.runfolder import MARKER, RunLock, claim, clean_partials, delete_outputs
from skippipe.runtime.transport import FORWARD, Message, MessageBounds, decode_header, encode_header

# ---------------------------------------------------------------------- the verdict


def _ended(node: int, code: int | None, exc: BaseException | None = None) -> Ended:
    return Ended(node, code, status_of(node, exc) if code is not None and code >= 0 else None, f"logs/node-{node:03d}.log")


def test_a_killed_worker_is_blamed_before_the_peers_that_lost_it():
    v = verdict([
        _ended(0, 3, PeerLost(2, "connection reset")), _ended(1, None), _ended(2, -signal.SIGKILL),
        _ended(3, 3, MessageTimeout((2,), 5.0, "no activations")),
    ])
    assert (v.node, v.kind, v.exit_code) == (2, FaultKind.CRASH, 3)
    assert v.message == "node 2 died (killed by SIGKILL); see logs/node-002.log"


def test_timeouts_name_the_node_most_of_them_waited_for_whatever_the_wording():
    v = verdict([
        _ended(0, 3, MessageTimeout((4,), 5.0, "xyz")), _ended(1, 3, MessageTimeout((4, 2), 5.0, "abc")),
        _ended(2, 3, PeerLost(1, "broken pipe")), _ended(3, 0), _ended(4, None),
    ])
    assert (v.node, v.kind) == (4, FaultKind.MESSAGE_TIMEOUT)
    assert v.message.startswith("node 4 stopped answering (still running); node(s) 0, 1 waited for it:")



def test_a_chain_of_timeouts_names_the_node_at_its_end():
    # node 4 froze; node 0 timed out waiting for it and exited, then nodes 2 and 3 timed out waiting for node 0
    v = verdict([
        _ended(0, 3, MessageTimeout((4,), 5.0, "no gradients")), _ended(1, None),
        _ended(2, 3, MessageTimeout((0, 1), 5.0, "no activations")), _ended(3, 3, MessageTimeout((0,), 5.0, "x")),
        _ended(4, None), _ended(5, None), _ended(6, None),
    ])
    assert (v.node, v.kind) == (4, FaultKind.MESSAGE_TIMEOUT)
    assert v.message.startswith("node 4 stopped answering (still running); node(s) 0 waited for it: nothing arrived")
    # the chain ends in a barrier timeout: the one node still running went silent
    barrier = "the barrier that starts iteration 4 did not complete"
    v = verdict([_ended(0, 3, MessageTimeout((), 5.0, barrier)), _ended(2, 3, MessageTimeout((0,), 5.0, "x")),
                 _ended(3, 3, MessageTimeout((0,), 5.0, "x")), _ended(4, None)])
    assert v.node == 4 and v.message.startswith("node 4 stopped answering (still running); node(s) 0, 2, 3 waited")
    # node 0 lost node 4 (gloo's own timeout closed the pair) rather than timing out itself
    v = verdict([_ended(0, 3, PeerLost(4, "Application timeout caused pair closure")),
                 _ended(2, 3, MessageTimeout((0,), 5.0, "x")), _ended(3, 3, MessageTimeout((0,), 5.0, "x")),
                 _ended(4, None)])
    assert v.node == 4 and v.message.startswith("node 4 stopped answering (still running); node(s) 0 waited for it")
    # a cycle of timeouts ends where it started (no node to follow to)
    v = verdict([_ended(0, 3, MessageTimeout((1,), 5.0, "x")), _ended(1, 3, MessageTimeout((0,), 5.0, "x")),
                 _ended(2, None), _ended(3, None)])
    assert v.node in (0, 1)


def test_a_barrier_timeout_names_the_one_node_still_running():
    barrier = "the barrier that starts iteration 4 did not complete"
    v = verdict([_ended(0, 3, MessageTimeout((), 5.0, barrier)), _ended(1, 3, MessageTimeout((), 5.0, barrier)),
                 _ended(2, None)])
    assert (v.node, v.kind) == (2, FaultKind.MESSAGE_TIMEOUT)
    assert v.message.startswith("node 2 stopped answering (still running); node(s) 0, 1 waited for it: nothing arrived")
    # two nodes still running: which one went silent is not known, so none is named
    unknown = verdict([_ended(0, 3, MessageTimeout((), 5.0, barrier)), _ended(1, None), _ended(2, None)])
    assert unknown.node == 0 and unknown.message.startswith("node 0 stopped: nothing arrived for 5 s")

def test_own_failures_diverged_training_and_bad_messages():
    crash = verdict([_ended(0, 3, PeerLost(1, "gone")), _ended(1, 1, ZeroDivisionError("division by zero"))])
    assert (crash.node, crash.kind, crash.message) == (1, FaultKind.CRASH, "node 1 failed: ZeroDivisionError: division by zero")
    nan = float("nan")
    diverged = verdict([_ended(0, 3, TrainingDiverged(7, "loss", nan)), _ended(1, 3, TrainingDiverged(7, "loss", nan))])
    assert diverged.node is None and diverged.kind == FaultKind.DIVERGED
    assert diverged.message.startswith("training diverged at iteration 7")
    bad = verdict([_ended(0, 3, BadMessage(1, "a tensor of shape [9999]")), _ended(1, 0)])
    assert (bad.node, bad.kind) == (1, FaultKind.BAD_MESSAGE) and "node 1 sent messages the plan does not allow" in bad.message
    silent = verdict([Ended(3, 3, None, "logs/node-003.log"), _ended(0, 3, PeerLost(3, "x"))])
    assert silent.node == 3 and "no status written" in silent.message


@given(
    node=st.integers(0, 10_000), kind=st.sampled_from(list(FaultKind)), code=st.integers(0, 255),
    message=st.text(max_size=50), peers=st.lists(st.integers(0, 10_000), max_size=5),
    waited=st.none() | st.floats(0, 1e6), step=st.none() | st.integers(0, 10**9),
)
def test_worker_status_round_trips_through_json(node, kind, code, message, peers, waited, step):
    status = WorkerStatus(node, kind, code, message, tuple(peers), waited, step, None, step)
    assert WorkerStatus.from_json(status.to_json()) == status


# ---------------------------------------------------------------------- message headers

BOUNDS = MessageBounds(shape=(2, 16, 32), microbatches=frozenset({0, 1, 2}))


def _header(shape: list[int], mb: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return encode_header(Message(0, mb, FORWARD, torch.zeros(shape, dtype=dtype)))


def test_a_header_within_the_plan_is_accepted():
    assert decode_header(_header([2, 16, 32]), BOUNDS, src=3)[5] == [2, 16, 32]


@pytest.mark.parametrize("tamper, words", [
    (lambda h: h.__setitem__(7, 1 << 40), "a tensor of shape"),  # a huge first dimension: refused, never allocated
    (lambda h: h.__setitem__(5, 99), "corrupt message header"),  # ndim out of range
    (lambda h: h.__setitem__(3, 77), "corrupt message header"),  # unknown dtype code
    (lambda h: h.__setitem__(3, 4), "dtype"),  # int64: not an activation
    (lambda h: h.__setitem__(1, 9), "microbatch 9 is not in the plan"),
    (lambda h: h.__setitem__(2, 5), "corrupt message header"),  # no such direction
    (lambda h: h.__setitem__(6, 99), "corrupt message header"),  # no such wire format
])
def test_a_header_outside_the_plan_is_a_typed_error_naming_the_sender(tamper, words):
    h = _header([2, 16, 32])
    tamper(h)
    with pytest.raises(BadMessage, match=words) as info:
        decode_header(h, BOUNDS, src=3)
    assert info.value.peer == 3


# ---------------------------------------------------------------------- the rendezvous address


def _listening_addresses(port: int) -> set[str]:
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if int(p, 16) == port and state == "0A":  # LISTEN
            out.add(".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return out


def test_the_rendezvous_store_listens_on_the_configured_address_only():
    store = host_store("127.0.0.1", 0, 2, 5.0)
    assert _listening_addresses(store.port) == {"127.0.0.1"}
    del store


# ---------------------------------------------------------------------- run folders


def test_a_foreign_folder_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "config.json").write_text("mine")
    (tmp_path / "logs").mkdir()
    with pytest.raises(RunFolderError, match="not a skippipe run folder"):
        claim(tmp_path)
    with pytest.raises(RunFolderError, match="nothing was deleted"):
        delete_outputs(tmp_path)
    assert (tmp_path / "config.json").read_text() == "mine" and (tmp_path / "logs").is_dir()
    assert not (tmp_path / MARKER).exists()


def test_fresh_deletes_only_what_the_project_wrote(tmp_path):
    (tmp_path / "notes.txt").write_text("keep")
    claim(tmp_path)  # no clash: the folder becomes a run folder
    for name in ("logs", "checkpoints"):
        (tmp_path / name).mkdir()
    (tmp_path / "config.json").write_text("{}")
    assert sorted(delete_outputs(tmp_path)) == ["checkpoints", "config.json", "logs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER, "notes.txt"]


def test_stale_partial_checkpoints_are_cleaned_in_our_folders_only(tmp_path):
    claim(tmp_path / "ours")
    for root in (tmp_path / "ours", tmp_path / "theirs"):
        (root / "checkpoints" / ".step-000004.partial").mkdir(parents=True)
        (root / "checkpoints" / ".other.partial").mkdir()
    assert [p.name for p in clean_partials(tmp_path / "ours")] == [".step-000004.partial"]
    assert clean_partials(tmp_path / "theirs") == []
    assert (tmp_path / "ours" / "checkpoints" / ".other.partial").is_dir()
    assert (tmp_path / "theirs" / "checkpoints" / ".step-000004.partial").is_dir()


def test_one_run_per_folder_and_a_dead_holder_leaves_no_lock(tmp_path):
    claim(tmp_path)
    with RunLock(tmp_path):
        with pytest.raises(RunLocked) as info:
            RunLock(tmp_path).acquire()
        assert info.value.pid == os.getpid()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from skippipe.runtime.runfolder import RunLock; "
         "RunLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); time.sleep(600)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLocked):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    with RunLock(tmp_path):  # SIGKILL released it
        pass


def test_plan_only_and_fresh_never_touch_a_foreign_folder(tmp_path, capsys):
    cfg = write_config(tmp_path / "cfg", seven_node_plan())
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text("not yours")
    (foreign / "logs").mkdir()
    for flags in (["--plan-only"], ["--fresh"], ["--fresh", "--plan-only"]):
        assert main(["train", str(cfg), "--run-dir", str(foreign), "--no-progress", *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is not a skippipe run folder" in err[0] and "nothing was deleted or overwritten" in err[0]
    assert sorted(p.name for p in foreign.iterdir()) == ["config.json", "logs"]
    assert (foreign / "config.json").read_text() == "not yours"


# ---------------------------------------------------------------------- resume


def test_resume_with_a_changed_setting_names_the_key(tmp_path):
    cfg = load_run_config(write_config(tmp_path, seven_node_plan()))
    previous = tmp_path / "previous.json"
    previous.write_text(json.dumps(cfg.to_dict()))
    check_resume_config(cfg.with_overrides(train={"steps": 99}, runtime={"time_scale": 0.5}), previous)  # allowed
    with pytest.raises(ResumeMismatch, match=r"--resume: \[model\] ctx is 32 now but 16 in") as info:
        check_resume_config(cfg.with_overrides(model={"ctx": 32}), previous)
    assert info.value.key == "[model] ctx"
    with pytest.raises(ResumeMismatch, match=r"\[train\] lr"):
        check_resume_config(cfg.with_overrides(train={"lr": 1.0}), previous)
