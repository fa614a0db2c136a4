"""A recorded episode written straight into a buffer, as `user-rl record` writes one: for the replay tests."""

from __future__ import annotations

import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from user_rl.recording.writer import EpisodeWriter
from user_rl.wire import user_rl_pb2 as pb


def write_episode(
    buffer: Path,
    robot_id: str,
    obs_space: gym.spaces.Dict,
    action_space: gym.spaces.Box,
    actions: np.ndarray,
    hz: float,
    task: str = "replay me",
) -> None:
    """One episode of a person's `actions` (its observation `state` all zeros), ended by a time limit."""
    writer = EpisodeWriter(buffer, robot_id, obs_space, action_space, task, hz, batch_rows=max(1, round(hz)))
    obs = {"state": np.zeros(obs_space["state"].shape, np.float32)}
    for i, action in enumerate(actions):
        last = i == len(actions) - 1
        writer.add(
            obs=obs,
            action=np.asarray(action, np.float32),
            reward=0.0,
            terminated=False,
            truncated=last,
            episode=0,
            step=i,
            policy_version=0,
            actor=pb.ACTOR_HUMAN,
            label=pb.LABEL_NONE,
            sensor_time=time.time(),
            final_obs=obs if last else None,
        )
    writer.close()
