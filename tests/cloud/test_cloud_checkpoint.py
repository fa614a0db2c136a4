"""Background checkpoints: the learner hands over a snapshot and goes on while a thread writes
it; each write atomically replaces the last, so a crash mid-write leaves the previous one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from user_rl.cloud.checkpoint import BackgroundCheckpointer, load_checkpoint, save_checkpoint, snapshot
from user_rl.testing.wait import wait_until

BIG = 64 * 2**20  # float32 elements: 256 MiB, long enough a write to catch in progress


def test_writes_run_in_the_background_and_the_newest_snapshot_wins(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    writer = BackgroundCheckpointer(path)
    try:
        writer.submit({"n": 1, "weights": torch.ones(BIG)})
        tmp = path.with_suffix(".pt.tmp")
        wait_until(tmp.exists, 30, "the background write to start", poll_s=0.001)
        assert not path.exists()  # the caller is free while the file is still being written
        writer.submit({"n": 2, "weights": torch.zeros(4)})  # superseded before it is written
        writer.submit({"n": 3, "weights": torch.full((4,), 3.0)})
    finally:
        writer.close()
    state = load_checkpoint(path)
    assert state["n"] == 3 and torch.equal(state["weights"], torch.full((4,), 3.0))
    assert writer.written == 2 and writer.last_error is None
    assert not path.with_suffix(".pt.tmp").exists()


def test_snapshot_is_independent_of_later_updates() -> None:
    net = torch.nn.Linear(3, 2)
    state = snapshot({"net": net.state_dict(), "step": [1, 2]})
    with torch.no_grad():
        net.weight.add_(1.0)
    assert not torch.equal(state["net"]["weight"], net.weight)


KILLED_WRITER = (
    """
import sys, time, torch
from pathlib import Path
from user_rl.cloud.checkpoint import BackgroundCheckpointer, save_checkpoint
path = Path(sys.argv[1])
save_checkpoint(path, {"n": 1, "weights": torch.ones(4)})
writer = BackgroundCheckpointer(path)
writer.submit({"n": 2, "weights": torch.zeros(%d)})
print("submitted", flush=True)
time.sleep(600)
"""
    % BIG
)


def test_a_crash_mid_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "submitted"
        wait_until(path.with_suffix(".pt.tmp").exists, 30, "the second write to start", poll_s=0.001)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    state = load_checkpoint(path)
    assert state["n"] == 1 and torch.equal(state["weights"], torch.ones(4))
    # The next writer replaces the torn temporary file.
    save_checkpoint(path, {"n": 3})
    assert load_checkpoint(path)["n"] == 3


def test_a_failed_write_is_reported_and_does_not_stop_the_writer(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the run directory should be")
    writer = BackgroundCheckpointer(blocker / "checkpoint.pt")
    try:
        writer.submit({"n": 1})
        wait_until(lambda: writer.last_error is not None, 30, "the write to fail")
        assert "not-a-directory" in writer.last_error and writer.written == 0
        assert "training goes on" in caplog.text
        blocker.unlink()  # the disk problem is fixed: the next snapshot is written
        writer.submit({"n": 2})
    finally:
        writer.close()
    assert load_checkpoint(blocker / "checkpoint.pt")["n"] == 2 and writer.written == 1


SPACES_TEXT = """
from user_rl.wire.spaces import spaces_to_text
from user_rl.hal.registry import robot_spaces
print(spaces_to_text(*robot_spaces("mujoco_reach", {"obs_mode": "image", "image_size": 16, "targets": "two_colours"}))
      ["hello_hex"])
"""


def test_spaces_text_is_the_same_in_every_process_and_old_orders_still_match(tmp_path: Path) -> None:
    """A resumed learner (a new process) reopens its buffer only if it writes its spaces as the last
    one did: protobuf orders map entries by a per-process hash unless told to sort them, and the
    two-colour reach's three observation keys came out in different orders."""
    from user_rl.cloud.buffer.store import PersistentReplay
    from user_rl.wire import user_rl_pb2 as pb
    from user_rl.wire.spaces import same_spaces, spaces_from_text

    texts = {
        subprocess.run(
            [sys.executable, "-c", SPACES_TEXT],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "MUJOCO_GL": "egl"},
        ).stdout.strip()
        for _ in range(4)
    }
    assert len(texts) == 1, texts
    (text,) = texts
    obs_space, action_space = spaces_from_text({"hello_hex": text})
    PersistentReplay(tmp_path, obs_space, action_space).close()
    PersistentReplay(tmp_path, obs_space, action_space).close()  # reopens

    # A buffer written before the text was sorted keeps whatever order its learner wrote: still a match.
    hello = pb.Hello.FromString(bytes.fromhex(text))
    parts = [
        pb.Hello(observation_space={key: hello.observation_space[key]}).SerializeToString()
        for key in sorted(hello.observation_space, reverse=True)
    ]
    unsorted = (b"".join(parts) + pb.Hello(action_space=hello.action_space).SerializeToString()).hex()
    assert unsorted != text and same_spaces({"hello_hex": unsorted}, obs_space, action_space)
