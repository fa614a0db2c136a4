"""A tiny real gymnasium env shaped like gym-hil's Panda (a nested Dict observation, success as
`info["succeed"]`), registered as `UserRLNested-v0` when this module is imported.

Its observation: `agent_pos` (3 floats, float64 as many envs give them), `pixels: {front, wrist}`
(16x16 RGB, front filled with the step count, wrist with 200 - it), and `deep: {a: {b}}` (one float,
three levels down). The point moves by half the action; the episode ends (terminated, `succeed`
True) once it is within 0.2 of the origin, else after 20 steps (truncated, `succeed` False). It has
an expert (`expert_action()`, `distance_to_goal()`), so the scripted intervener can drive it.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

ENV_ID = "UserRLNested-v0"
SIZE = 16
MAX_STEPS = 20
FLAT_KEYS = {"agent_pos", "pixels.front", "pixels.wrist", "deep.a.b"}


class NestedEnv(gym.Env):
    metadata = {"render_modes": [], "render_fps": 10}
    observation_space = gym.spaces.Dict(
        {
            "agent_pos": gym.spaces.Box(-2.0, 2.0, (3,), np.float64),
            "pixels": gym.spaces.Dict(
                {
                    "front": gym.spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8),
                    "wrist": gym.spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8),
                }
            ),
            "deep": gym.spaces.Dict({"a": gym.spaces.Dict({"b": gym.spaces.Box(-1.0, 1.0, (1,), np.float32)})}),
        }
    )
    action_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1.5, 1.5, 3)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        self.pos = np.clip(self.pos + 0.5 * np.asarray(action, np.float64), -2.0, 2.0)
        self.steps += 1
        succeed = bool(np.linalg.norm(self.pos) < 0.2)
        return self._obs(), float(succeed), succeed, False, {"succeed": succeed}

    def expert_action(self) -> np.ndarray:
        """Straight to the origin."""
        return np.clip(-2.0 * self.pos, -1.0, 1.0).astype(np.float32)

    def distance_to_goal(self) -> float:
        return float(np.linalg.norm(self.pos))

    def _obs(self):
        return {
            "agent_pos": self.pos.copy(),
            "pixels": {
                "front": np.full((SIZE, SIZE, 3), self.steps, np.uint8),
                "wrist": np.full((SIZE, SIZE, 3), 200 - self.steps, np.uint8),
            },
            "deep": {"a": {"b": np.array([self.steps / MAX_STEPS], np.float32)}},
        }


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=NestedEnv, max_episode_steps=MAX_STEPS)
