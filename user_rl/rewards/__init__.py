"""Rewards: which reward a run learns from, decided on the edge before a row is recorded.

| `reward.type` | module | the recorded reward |
|---|---|---|
| `env` (default) | `env` | the environment's own reward |
| `labels` | `labels` | 1 on a row labelled success (by a person, or the env's success flag), else 0 |
| `classifier` | `classifier` | 1 where a learned success classifier judges the observation a success, else 0 |

With `labels` or `classifier` the environment's reward never leaves the edge: the row's reward
column is the chosen reward, and nothing else carries the env's. The classifier is trained from
labelled frames of a buffer by `training` (`user-rl reward train`).

    reward = make_reward("classifier", robot.observation_space, classifier="clf.pt", threshold=0.5)
    recorded = reward(result.observation, RewardedStep(result.reward, terminated, truncated, label, label_by))

Another installed package adds a reward through the `user_rl.rewards` entry-point group
(user_rl/plugins.py; docs/guides/add-a-reward.md): the entry point names a class with the
`StepReward` interface, built as `cls(observation_space)`.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym

from user_rl.plugins import REWARDS as REWARD_GROUP
from user_rl.plugins import known_names, load_plugin
from user_rl.rewards.base import RewardedStep, StepReward
from user_rl.rewards.classifier import ClassifierReward
from user_rl.rewards.env import EnvReward
from user_rl.rewards.labels import LabelReward

REWARDS: dict[str, type] = {"env": EnvReward, "labels": LabelReward, "classifier": ClassifierReward}


def make_reward(
    name: str,
    observation_space: gym.spaces.Dict,
    classifier: str | Path | None = None,
    threshold: float = 0.5,
    keys: list[str] | None = None,
) -> StepReward:
    if name == "classifier":
        if classifier is None:
            raise ValueError("reward.classifier: reward.type classifier needs the classifier file's path")
        return ClassifierReward(classifier, observation_space, threshold, keys)
    if name in REWARDS:
        return REWARDS[name]()
    plugin = load_plugin(REWARD_GROUP, name)
    if plugin is None:
        raise ValueError(f"unknown reward type {name!r}; known: {', '.join(reward_names())}")
    return plugin(observation_space)


def reward_names() -> list[str]:
    """Built-in rewards and those installed packages add (entry-point group `user_rl.rewards`)."""
    return known_names(REWARD_GROUP, REWARDS)


__all__ = [
    "REWARDS",
    "ClassifierReward",
    "EnvReward",
    "LabelReward",
    "RewardedStep",
    "StepReward",
    "make_reward",
    "reward_names",
]
