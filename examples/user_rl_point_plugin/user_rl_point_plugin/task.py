"""TASK: a point on a plane moves to a goal. A gymnasium env, so user-rl's `gym` robot runs it:

    robot: {type: gym, options: {env_id: "user_rl_point_plugin.task:PointReach-v0"}}

gymnasium imports the module before the colon, which registers the env below.

Observation: [x, y, goal_x, goal_y], each in [-1, 1]. Action: a velocity in [-1, 1]^2; the point
moves SPEED times it per step. The env's own reward is sparse: 1 on the step that reaches the
goal (which ends the episode), else 0. `info["is_success"]` is what `user-rl eval` counts.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

SPEED = 0.2  # distance moved per step at full action
RADIUS = 0.1  # the goal is reached this close to it
MAX_STEPS = 30  # a diagonal (2.8) takes 15 steps


class PointReach(gym.Env):
    metadata = {"render_modes": [], "render_fps": 20}

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.point = np.zeros(2, np.float32)
        self.goal = np.zeros(2, np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.point, self.goal = self.np_random.uniform(-1.0, 1.0, (2, 2)).astype(np.float32)
        return self._obs(), {}

    def step(self, action: np.ndarray):
        move = np.clip(action, -1.0, 1.0) * SPEED
        self.point = np.clip(self.point + move, -1.0, 1.0).astype(np.float32)
        reached = bool(np.linalg.norm(self.point - self.goal) < RADIUS)
        return self._obs(), float(reached), reached, False, {"is_success": reached}

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.point, self.goal]).astype(np.float32)


gym.register("PointReach-v0", entry_point=PointReach, max_episode_steps=MAX_STEPS)
