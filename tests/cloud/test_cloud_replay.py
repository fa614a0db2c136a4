"""ReplayBuffer: a ring that keeps the newest transitions; samples keep shapes and dtypes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from user_rl.cloud.replay import NEXT_OBS, ReplayBuffer
from user_rl.wire.transitions import OBS

OBS_SPACE = gym.spaces.Dict({
    "image": gym.spaces.Box(0, 255, (6, 5, 3), np.uint8),
    "state": gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
})
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def transitions(ids: range) -> dict[str, np.ndarray]:
    """Stitched columns whose every field encodes the transition's id."""
    i = np.asarray(ids, np.int64)
    n = len(i)
    return {
        OBS + "image": np.broadcast_to((i % 256).astype(np.uint8)[:, None, None, None], (n, 6, 5, 3)).copy(),
        NEXT_OBS + "image": np.broadcast_to(((i + 1) % 256).astype(np.uint8)[:, None, None, None], (n, 6, 5, 3)).copy(),
        OBS + "state": np.repeat(i[:, None].astype(np.float32), 4, axis=1),
        NEXT_OBS + "state": np.repeat((i + 1)[:, None].astype(np.float32), 4, axis=1),
        "action": np.stack([i, -i], axis=1).astype(np.float32) / 1000,
        "reward": i.astype(np.float32),
        "terminated": i % 7 == 0,
        "truncated": np.zeros(n, np.bool_),
        "policy_version": i // 10,
        "episode": np.zeros(n, np.uint64),
        "step": i,
    }


def stored_ids(buf: ReplayBuffer) -> list[int]:
    return sorted(int(r) for r in buf.columns["reward"][: len(buf)])


def test_ring_keeps_the_newest_capacity_transitions() -> None:
    buf = ReplayBuffer(OBS_SPACE, ACTION_SPACE, capacity=10)
    assert len(buf) == 0
    assert buf.add(transitions(range(0, 4)), robot=0) == 4
    assert len(buf) == 4 and stored_ids(buf) == [0, 1, 2, 3]
    buf.add(transitions(range(4, 11)), robot=1)  # wraps: 11 added, capacity 10
    assert len(buf) == 10
    assert stored_ids(buf) == list(range(1, 11))
    buf.add(transitions(range(11, 16)), robot=2)
    assert len(buf) == 10 and buf.added == 16
    assert stored_ids(buf) == list(range(6, 16))
    # Every column of a slot belongs to the same transition, robot index included.
    c = buf.columns
    ids = c["reward"].astype(np.int64)
    np.testing.assert_array_equal(c[OBS + "state"][:, 0], ids)
    np.testing.assert_array_equal(c[NEXT_OBS + "state"][:, 3], ids + 1)
    np.testing.assert_array_equal(c[OBS + "image"][:, 0, 0, 0], ids % 256)
    np.testing.assert_array_equal(c[NEXT_OBS + "image"][:, 5, 4, 2], (ids + 1) % 256)
    np.testing.assert_array_equal(c["terminated"], ids % 7 == 0)
    np.testing.assert_array_equal(c["policy_version"], ids // 10)
    np.testing.assert_array_equal(c["robot"], np.where(ids >= 11, 2, np.where(ids >= 4, 1, 0)))


def test_one_add_larger_than_capacity_keeps_its_tail() -> None:
    buf = ReplayBuffer(OBS_SPACE, ACTION_SPACE, capacity=8)
    buf.add(transitions(range(3)), robot=0)
    buf.add(transitions(range(100, 125)), robot=0)
    assert len(buf) == 8
    assert stored_ids(buf) == list(range(117, 125))


def test_empty_add_is_a_no_op() -> None:
    buf = ReplayBuffer(OBS_SPACE, ACTION_SPACE, capacity=8)
    assert buf.add({}, robot=0) == 0
    assert buf.add(transitions(range(0)), robot=0) == 0
    assert len(buf) == 0


def test_sample_shapes_and_dtypes() -> None:
    buf = ReplayBuffer(OBS_SPACE, ACTION_SPACE, capacity=50)
    buf.add(transitions(range(20)), robot=3)
    batch = buf.sample(32, np.random.default_rng(0))
    assert batch[OBS + "image"].shape == (32, 6, 5, 3) and batch[OBS + "image"].dtype == np.uint8
    assert batch[NEXT_OBS + "image"].shape == (32, 6, 5, 3) and batch[NEXT_OBS + "image"].dtype == np.uint8
    assert batch[OBS + "state"].shape == (32, 4) and batch[OBS + "state"].dtype == np.float32
    assert batch[NEXT_OBS + "state"].shape == (32, 4) and batch[NEXT_OBS + "state"].dtype == np.float32
    assert batch["action"].shape == (32, 2) and batch["action"].dtype == np.float32
    assert batch["reward"].shape == (32,) and batch["reward"].dtype == np.float32
    assert batch["terminated"].shape == (32,) and batch["terminated"].dtype == np.bool_
    # Only filled slots are sampled (ids 0..19; an unfilled slot would read as reward 0 + state 0
    # everywhere, so check the images against the rewards too), and rows stay aligned.
    ids = batch["reward"].astype(np.int64)
    assert ids.min() >= 0 and ids.max() < 20
    np.testing.assert_array_equal(batch[OBS + "state"][:, 0], ids)
    np.testing.assert_array_equal(batch[NEXT_OBS + "image"][:, 0, 0, 0], ids + 1)
    assert (batch["robot"] == 3).all()
    # A sample is a copy: training code may modify it without corrupting the buffer.
    batch[OBS + "image"][:] = 0
    assert buf.columns[OBS + "image"][:20, 0, 0, 0].tolist() == list(range(20))


def test_sampling_an_empty_buffer_raises() -> None:
    buf = ReplayBuffer(OBS_SPACE, ACTION_SPACE, capacity=8)
    with pytest.raises(ValueError):
        buf.sample(4, np.random.default_rng(0))
