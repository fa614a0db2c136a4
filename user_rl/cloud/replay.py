"""An in-memory ring of complete transitions; images stay uint8.

This is the simple RAM store the learner samples from; the persistent, cache-aware buffer
replaces it behind the same `add` / `sample` methods.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from user_rl.wire.transitions import OBS

NEXT_OBS = "next_" + OBS


class ReplayBuffer:
    def __init__(self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, capacity: int) -> None:
        self.capacity = capacity
        self.obs_keys = sorted(obs_space.spaces)
        self.columns: dict[str, np.ndarray] = {}
        for key in self.obs_keys:
            space = obs_space[key]
            self.columns[OBS + key] = np.zeros((capacity, *space.shape), space.dtype)
            self.columns[NEXT_OBS + key] = np.zeros((capacity, *space.shape), space.dtype)
        self.columns["action"] = np.zeros((capacity, *action_space.shape), action_space.dtype)
        self.columns["reward"] = np.zeros(capacity, np.float32)
        self.columns["terminated"] = np.zeros(capacity, np.bool_)
        self.columns["policy_version"] = np.zeros(capacity, np.int64)
        self.columns["robot"] = np.zeros(capacity, np.int32)
        self.size = 0
        self.cursor = 0
        self.added = 0

    def __len__(self) -> int:
        return self.size

    def add(self, transitions: dict[str, np.ndarray], robot: int) -> int:
        """Append stitched transitions (columns as produced by `EpisodeStitcher`)."""
        n = len(transitions.get("reward", ()))
        if n == 0:
            return 0
        if n > self.capacity:
            transitions = {k: v[-self.capacity :] for k, v in transitions.items()}
            n = self.capacity
        index = (self.cursor + np.arange(n)) % self.capacity
        for key, column in self.columns.items():
            column[index] = robot if key == "robot" else transitions[key]
        self.cursor = int((self.cursor + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)
        self.added += n
        return n

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        index = rng.integers(0, self.size, size=batch_size)
        return {key: column[index] for key, column in self.columns.items()}
