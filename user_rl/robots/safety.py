"""The action filter every action passes on its way to a robot, sims included.

It turns a non-finite action into a hold (the middle of the action range) and clips to the
action space, counting each violation so the heartbeat can report it.
"""

from __future__ import annotations

from collections import Counter

import gymnasium as gym
import numpy as np


class ActionFilter:
    def __init__(self, action_space: gym.spaces.Box) -> None:
        self.low = action_space.low.astype(np.float64)
        self.high = action_space.high.astype(np.float64)
        self.hold = ((self.low + self.high) / 2.0).astype(action_space.dtype)
        self.dtype = action_space.dtype
        self.violations: Counter[str] = Counter()

    def __call__(self, action: np.ndarray) -> np.ndarray:
        action = np.asarray(action, dtype=np.float64).reshape(self.low.shape)
        if not np.isfinite(action).all():
            self.violations["non_finite"] += 1
            return self.hold.copy()
        if (action < self.low).any() or (action > self.high).any():
            self.violations["clipped"] += 1
            action = np.clip(action, self.low, self.high)
        return action.astype(self.dtype)
