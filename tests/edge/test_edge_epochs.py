"""Stream epochs from a counter next to the spool: they only go forward, whatever the clock does."""

from __future__ import annotations

import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import zmq

from user_rl.edge.epochs import COUNTER_NAME, next_epoch, temp_counter_path
from user_rl.edge.link import DataLink, LinkSettings
from user_rl.edge.spool import Spool
from user_rl.hal.descriptor import DeviceDescriptor


def test_a_fresh_spool_starts_at_one_and_every_start_counts_up(tmp_path: Path) -> None:
    epochs = [next_epoch(tmp_path, "arm-0") for _ in range(3)]
    assert epochs == [1, 2, 3]
    assert (tmp_path / COUNTER_NAME).read_text().strip() == "3"
    assert not list(tmp_path.glob("*.tmp"))


def test_epochs_ignore_a_clock_stepped_back(tmp_path: Path, monkeypatch) -> None:
    first = next_epoch(tmp_path, "arm-0")
    monkeypatch.setattr(time, "time_ns", lambda: 1)  # the clock jumped to 1970
    assert next_epoch(tmp_path, "arm-0") == first + 1


def test_an_epoch_found_in_the_spool_is_never_reused(tmp_path: Path) -> None:
    """An old spool (say, epochs from the wall clock of an earlier version) and a lost counter."""
    spool = Spool(tmp_path, 1 << 20)
    spool.put(1_700_000_000_000_000_000, 1, [b"x"])
    (tmp_path / COUNTER_NAME).unlink(missing_ok=True)
    assert next_epoch(tmp_path, "arm-0", Spool(tmp_path, 1 << 20).epochs()) == 1_700_000_000_000_000_001


def test_an_unreadable_counter_continues_above_anything_it_could_have_held(tmp_path: Path) -> None:
    (tmp_path / COUNTER_NAME).write_text("garbage\n")
    assert next_epoch(tmp_path, "arm-0") > time.time_ns() - 10**9  # a clock value: above any count


def test_temporary_spools_of_one_robot_order_even_when_the_clock_steps_back(monkeypatch) -> None:
    robot = f"sim-epochs-{time.time_ns()}"
    counter = temp_counter_path(robot)
    try:
        first = next_epoch(None, robot)
        monkeypatch.setattr(time, "time_ns", lambda: 5)
        second, third = next_epoch(None, robot), next_epoch(None, robot)
        assert first < second < third
        assert temp_counter_path("a/b") != temp_counter_path("a_b")  # ids that sanitise alike stay apart
    finally:
        counter.unlink(missing_ok=True)


def test_each_life_of_a_link_on_one_spool_gets_the_next_epoch(tmp_path: Path) -> None:
    context = zmq.Context()
    descriptor = DeviceDescriptor("robot", "test", "arm-7")
    space = gym.spaces.Dict({"state": gym.spaces.Box(-1.0, 1.0, (3,), np.float32)})
    action = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    epochs = []
    try:
        for _ in range(3):
            link = DataLink(
                context, "tcp://127.0.0.1:9", descriptor, space, action, settings=LinkSettings(spool_dir=str(tmp_path))
            )
            epochs.append(link.epoch)
            link.close()
    finally:
        context.term()
    assert epochs == [1, 2, 3]


def test_a_counter_past_what_the_learner_indexes_is_refused(tmp_path: Path) -> None:
    (tmp_path / COUNTER_NAME).write_text(f"{2**63 - 1}\n")
    with pytest.raises(ValueError, match="at most"):
        next_epoch(tmp_path, "arm-0")
