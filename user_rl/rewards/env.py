"""`reward.type: env`: the environment's own reward, as the robot or sim returns it (the default)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from user_rl.rewards.base import RewardedStep


class EnvReward:
    name = "env"

    def __init__(self, observation_space: gym.spaces.Dict | None = None) -> None:
        """Every reward is built from the robot's observation space; this one needs nothing of it."""

    def __call__(self, next_obs: dict[str, np.ndarray], env_step: RewardedStep) -> RewardedStep:
        return env_step
