"""Idle take-overs in the buffer (issue 33, point 5): a person who takes over and holds nothing
records "human" rows that only hold the robot still (2,355 of 2,650 in one run). Such rows are
flagged idle; the sampler draws them as `idle_rows` says (default: never), so they never weigh as
demonstrations, and a buffer written before the flag existed opens and goes on.

Real buffer files (written, closed, reopened), the real sampler, and the real behaviour cloning's
row weights."""

from __future__ import annotations

import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from user_rl.algos.base import imitation_weights
from user_rl.algos.bc import BehaviourCloning
from user_rl.cloud.batches import training_columns
from user_rl.cloud.buffer import store as store_module
from user_rl.cloud.buffer.inspect import inspect_buffer
from user_rl.cloud.buffer.segment import read_layout
from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.config import BufferConfig
from user_rl.edge.batching import BatchBuilder
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import IDLE, OBS

OBS_SPACE = gym.spaces.Dict({"state": gym.spaces.Box(-10.0, 10.0, (3,), np.float32)})
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
EPISODES = 50
POLICY_STEPS = 10  # each episode: the policy, then a person takes over for the rest
PERSON_STEPS = 53  # 50 x 53 = 2,650 person rows ...
IDLE_ROWS = 2355  # ... of which 2,355 idle, as in the run
RLPD = {"online": 0.5, "intervention": 0.5}  # the intervention half is where demonstrations come from
DRAWS = 40


def active_steps(episode: int) -> int:
    """How many of the episode's person steps moved the robot (the rest held nothing): 2,650 - 2,355."""
    return 6 if episode < 45 else 5  # 45 x 6 + 5 x 5 = 295


def take_over_episode(episode: int, rng: np.random.Generator, with_idle: bool = True) -> dict[str, np.ndarray]:
    """One episode: the policy acts, then a person takes over, drives a few steps and holds nothing
    for the rest (the robot, a delta robot, gets zero: holds still). `state` = (episode, step, idle)."""
    length = POLICY_STEPS + PERSON_STEPS
    builder = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=length)
    for step in range(length):
        person = step >= POLICY_STEPS
        idle = person and step - POLICY_STEPS >= active_steps(episode)
        action = np.zeros(2, np.float32) if idle else rng.uniform(-1, 1, 2).astype(np.float32)
        obs = {"state": np.array([episode, step, idle], np.float32)}
        last = step == length - 1
        builder.add(
            obs,
            action,
            0.0,
            False,
            last,
            episode=episode,
            step=step,
            policy_version=3,
            actor=pb.ACTOR_HUMAN if person else pb.ACTOR_POLICY,
            label=pb.LABEL_NONE,
            sensor_time=time.time(),
            final_obs=obs if last else None,
            **({"idle": idle} if with_idle else {}),
        )
    cols = builder.take()[1]
    if not with_idle:
        del cols[IDLE]  # an edge from before the flag sends no such column
    return cols


def write_take_overs(directory: Path, episodes: range = range(EPISODES)) -> None:
    """What the edge sent, through a buffer that is then closed (sealed files and an index)."""
    store = PersistentReplay(directory, OBS_SPACE, ACTION_SPACE, BufferConfig(segment_mb=0.01))
    stream = store.open_stream("arm-0", 1, "reach")
    rng = np.random.default_rng(0)
    for episode in episodes:
        assert store.add(stream, episode + 1, take_over_episode(episode, rng))
        store.commit()
    store.close()


def reopened(directory: Path, **settings) -> PersistentReplay:
    return PersistentReplay(directory, OBS_SPACE, ACTION_SPACE, BufferConfig(segment_mb=0.01, **settings))


def drawn(buffer: PersistentReplay, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [buffer.sample(256, rng) for _ in range(DRAWS)]


def bc_weights(batch: dict[str, np.ndarray], idle_weight: float, chunk: bool = False) -> np.ndarray:
    """What behaviour cloning (HG-DAgger) weighs each row, or each action of its chunk, by: the
    learner's batch preparation, then the algorithm's own weights."""
    columns = training_columns(batch, BehaviourCloning.batch_columns, idle_weight)
    tensors = {name: torch.as_tensor(value) for name, value in columns.items() if name != "obs"}
    return imitation_weights(tensors, policy_row_weight=0.0, prefix="chunk_" if chunk else "").numpy()


def test_by_default_no_idle_row_is_drawn_or_weighs_as_a_demonstration(tmp_path: Path) -> None:
    write_take_overs(tmp_path / "buffer")
    buffer = reopened(tmp_path / "buffer", mix=RLPD)  # the default idle_rows: drop
    assert buffer.settings.idle_rows == "drop" and buffer.idle_weight == 0.0
    batches = drawn(buffer)
    rows = {name: np.concatenate([b[name] for b in batches]) for name in ("actor", IDLE, "action", OBS + "state")}
    person = rows["actor"] == pb.ACTOR_HUMAN
    # Half of every batch is the intervention source, and none of it is an idle row.
    assert person.mean() == pytest.approx(0.5, abs=0.01)
    assert not rows[IDLE].any() and not rows[OBS + "state"][:, 2].any()
    weights = np.concatenate([bc_weights(b, buffer.idle_weight) for b in batches])
    demonstrations = weights > 0
    assert demonstrations.sum() == person.sum() > 0
    assert np.abs(rows["action"][demonstrations]).sum(1).min() > 0  # no zero-action demonstration row
    # Every person row that moved the robot is drawn; the idle ones stay stored, and are read back.
    moved = {(int(e), int(s)) for e, s, _ in rows[OBS + "state"][person]}
    assert len(moved) == sum(active_steps(e) for e in range(EPISODES)) == 2650 - IDLE_ROWS
    report = inspect_buffer(tmp_path / "buffer")
    assert report["who"]["acted"]["person"] == 2650 and report["who"]["person_idle"] == IDLE_ROWS
    buffer.close()


def test_a_chunk_that_runs_into_idle_steps_imitates_only_the_moving_ones(tmp_path: Path) -> None:
    write_take_overs(tmp_path / "buffer", range(10))
    buffer = reopened(tmp_path / "buffer", action_horizon=8)
    batches = drawn(buffer)
    chunk_idle = np.concatenate([b["chunk_" + IDLE] for b in batches])
    chunk_actor = np.concatenate([b["chunk_actor"] for b in batches])
    mask = np.concatenate([b["chunk_mask"] for b in batches])
    assert not np.concatenate([b[IDLE] for b in batches]).any()  # no chunk starts at an idle row
    runs_into = chunk_idle & mask
    assert runs_into.any()  # the last moving steps' chunks run on into the idle ones
    weights = np.concatenate([bc_weights(b, buffer.idle_weight, chunk=True) for b in batches])
    assert (weights[runs_into] == 0).all()
    assert (weights[(chunk_actor == pb.ACTOR_HUMAN) & ~chunk_idle & mask] == 1).all()
    buffer.close()


@pytest.mark.parametrize("idle_rows", ["keep", "downweight"])
def test_idle_rows_can_be_kept_or_down_weighted(tmp_path: Path, idle_rows: str) -> None:
    write_take_overs(tmp_path / "buffer")
    buffer = reopened(tmp_path / "buffer", mix=RLPD, idle_rows=idle_rows, idle_weight=0.1)
    batches = drawn(buffer)
    actor = np.concatenate([b["actor"] for b in batches])
    idle = np.concatenate([b[IDLE] for b in batches])
    person = actor == pb.ACTOR_HUMAN
    weight = 1.0 if idle_rows == "keep" else 0.1
    expected = IDLE_ROWS * weight / (IDLE_ROWS * weight + 2650 - IDLE_ROWS)  # 0.89 kept, 0.44 down-weighted
    assert idle[person].mean() == pytest.approx(expected, abs=0.03)
    assert buffer.idle_weight == weight
    weights = np.concatenate([bc_weights(b, buffer.idle_weight) for b in batches])
    assert (weights[person] == 1).all()  # a drawn row weighs 1: the sampler already weighed it
    buffer.close()


def test_the_run_takes_idle_rows_from_the_teleop_section() -> None:
    from user_rl.config import Config

    cfg = Config.model_validate({"teleop": {"idle_rows": "downweight", "idle_weight": 0.2}})
    assert (cfg.run_buffer().idle_rows, cfg.run_buffer().idle_weight) == ("downweight", 0.2)
    assert Config().run_buffer().idle_rows == "drop"
    with pytest.raises(ValueError, match="buffer.idle_rows: a run takes it from teleop.idle_rows"):
        Config.model_validate({"buffer": {"idle_rows": "keep"}})
    saved = Config.model_validate(cfg.model_dump())  # a run's config.yaml, read back to resume it
    assert (saved.run_buffer().idle_rows, saved.run_buffer().idle_weight) == ("downweight", 0.2)


def test_a_buffer_written_before_the_idle_flag_opens_and_goes_on(tmp_path: Path, monkeypatch) -> None:
    """Its segments have no idle column (nor had its edges): they read as not idle, and an episode
    left open in them continues with flagged rows from a newer edge."""
    directory = tmp_path / "buffer"
    without = store_module.segment_schema

    def old_schema(*spaces):
        return {name: column for name, column in without(*spaces).items() if name != IDLE}

    with monkeypatch.context() as patch:
        patch.setattr(store_module, "segment_schema", old_schema)
        old = PersistentReplay(directory, OBS_SPACE, ACTION_SPACE, BufferConfig(segment_mb=0.01, idle_rows="keep"))
        stream = old.open_stream("arm-0", 1, "reach")
        rng = np.random.default_rng(0)
        for episode in range(3):
            assert old.add(stream, episode + 1, take_over_episode(episode, rng, with_idle=False))
        cols = take_over_episode(3, rng, with_idle=False)
        first_half = {k: v[:30] for k, v in cols.items() if not k.startswith("final")}
        first_half["final_row"] = np.zeros(0, np.int64)
        assert old.add(stream, 4, first_half)  # episode 3 stays open: its edge goes on later
        old.close()
    for path in directory.glob("seg-*.seg"):
        assert IDLE not in [column["name"] for column in read_layout(path)["columns"]]
    buffer = reopened(directory)
    stream = buffer.stream("arm-0", 1)
    rest = take_over_episode(3, np.random.default_rng(1))  # the same episode, from a newer edge
    second_half = {k: v[30:] for k, v in rest.items() if not k.startswith("final")}
    second_half["final_row"] = rest["final_row"] - 30
    second_half.update({k: v for k, v in rest.items() if k.startswith("final_obs")})
    assert buffer.add(stream, 5, second_half)
    buffer.commit()
    batches = drawn(buffer)
    state = np.concatenate([b[OBS + "state"] for b in batches])
    idle = np.concatenate([b[IDLE] for b in batches])
    assert not idle.any()
    old_rows = state[:, 0] < 3
    assert old_rows.any() and state[old_rows, 2].any()  # the old edge's idle rows: not flagged, so drawn
    assert not ((state[:, 0] == 3) & (state[:, 1] >= 30)).any()  # the newer edge's rows: all idle, dropped
    assert ((state[:, 0] == 3) & (state[:, 1] == 29)).any()  # the old segment's last row got its successor
    buffer.close()
    report = inspect_buffer(directory)
    newer_rows = POLICY_STEPS + PERSON_STEPS - 30
    assert report["ok"] and report["who"]["person_idle"] == newer_rows
    assert report["who"]["acted"]["person"] == 4 * PERSON_STEPS
