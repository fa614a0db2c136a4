"""`reward.type: env`: the environment's own reward, as the robot or sim returns it (the default)."""

from __future__ import annotations

import numpy as np

from user_rl.rewards.base import RewardedStep


class EnvReward:
    name = "env"

    def __call__(self, next_obs: dict[str, np.ndarray], env_step: RewardedStep) -> RewardedStep:
        return env_step
