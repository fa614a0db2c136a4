"""`reward.type: labels`: sparse success from labels. A row labelled success (by a person on the
teleop page, or by the env's own success flag at an episode's end) has reward 1; every other row 0.

A label sits on an episode's last row (marking ends the episode), so this is the classic sparse
task reward: 1 when the task is done, else 0, with nothing of the env's own reward in it.
"""

from __future__ import annotations

from dataclasses import replace

import gymnasium as gym
import numpy as np

from user_rl.rewards.base import RewardedStep
from user_rl.wire import user_rl_pb2 as pb


class LabelReward:
    name = "labels"

    def __init__(self, observation_space: gym.spaces.Dict | None = None) -> None:
        """Every reward is built from the robot's observation space; this one needs nothing of it."""

    def __call__(self, next_obs: dict[str, np.ndarray], env_step: RewardedStep) -> RewardedStep:
        return replace(env_step, reward=float(env_step.label == pb.LABEL_SUCCESS))
