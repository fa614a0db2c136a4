"""What a reward decides for one step, and the interface every reward follows.

The edge daemon calls its reward once per step, after the robot stepped and before the row is
recorded, with what the robot returned and any label (a person's mark, or the env's own success
flag at an episode's end). The reward's answer is what the row carries: with any reward other
than `env`, the environment's reward stops at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class RewardedStep:
    """A step as it is recorded: the reward to learn from, how the episode ends, its label and who gave it."""

    reward: float
    terminated: bool
    truncated: bool
    label: int  # pb.Label
    label_by: int  # pb.LabelBy (meaningful where label is not LABEL_NONE)

    @property
    def ended(self) -> bool:
        return self.terminated or self.truncated


class StepReward(Protocol):
    name: str

    def __call__(self, next_obs: dict[str, np.ndarray], env_step: RewardedStep) -> RewardedStep:
        """`next_obs`: the observation after the step; `env_step`: the env's reward, its episode
        end and the label so far. Returns what the row records."""
        ...
