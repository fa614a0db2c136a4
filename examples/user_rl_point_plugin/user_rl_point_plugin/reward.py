"""REWARD: the task's sparse reward, shaped by the distance left to the goal.

user-rl calls a reward once per step on the edge, after the robot stepped and before the row is
recorded; what it returns is what the learner trains on. This one adds minus the distance from
the point to the goal (read from the observation) to the env's reward, so every step says how
far there is still to go, not only the step that arrives.
"""

from __future__ import annotations

from dataclasses import replace

import gymnasium as gym
import numpy as np

from user_rl.rewards import RewardedStep


class DistanceReward:
    name = "point_distance"

    def __init__(self, observation_space: gym.spaces.Dict) -> None:
        state = observation_space.spaces.get("state")
        if state is None or state.shape != (4,):
            raise ValueError(
                f"reward.type point_distance reads a 'state' of [x, y, goal_x, goal_y]; "
                f"this robot observes {observation_space}"
            )

    def __call__(self, next_obs: dict[str, np.ndarray], env_step: RewardedStep) -> RewardedStep:
        state = next_obs["state"]
        distance = float(np.linalg.norm(state[:2] - state[2:]))
        return replace(env_step, reward=env_step.reward - distance)
