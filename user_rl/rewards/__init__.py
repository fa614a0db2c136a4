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
    reward = make_reward(cfg.reward.type, robot.observation_space, **cfg.reward.options())
    recorded = reward(result.observation, RewardedStep(result.reward, terminated, truncated, label, label_by))

Another installed package adds a reward through the `user_rl.rewards` entry-point group
(user_rl/plugins.py; docs/guides/add-a-reward.md): the entry point names a class with the
`StepReward` interface, built as `cls(observation_space, **settings.options())` from the settings
class it names in a `Settings` attribute (a `RewardSettings` subclass; without one it takes none).
A built-in reward is added the same way: its module and one line in `REWARDS`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from user_rl.config_plugins import RewardSettings
from user_rl.plugins import REWARDS as REWARD_GROUP
from user_rl.plugins import builtin_or_plugin, known_names
from user_rl.rewards.base import RewardedStep, StepReward
from user_rl.rewards.classifier import ClassifierReward, ClassifierSettings
from user_rl.rewards.env import EnvReward
from user_rl.rewards.labels import LabelReward

REWARDS: dict[str, type] = {"env": EnvReward, "labels": LabelReward, "classifier": ClassifierReward}


def reward_class(name: str) -> type:
    """The class of a reward type; a plugin's is imported on first use."""
    return builtin_or_plugin(REWARD_GROUP, REWARDS, name, "reward type")


def reward_settings(name: str) -> type:
    """The settings class of a reward type (its `Settings`; `RewardSettings`, none of its own, without one)."""
    return getattr(reward_class(name), "Settings", RewardSettings)


def make_reward(name: str, observation_space: gym.spaces.Dict, **options: Any) -> StepReward:
    """Reward `name` for a robot with `observation_space`; `options`: its settings (`cfg.reward.options()`)."""
    return reward_class(name)(observation_space, **options)


def reward_names() -> list[str]:
    """Built-in rewards and those installed packages add (entry-point group `user_rl.rewards`)."""
    return known_names(REWARD_GROUP, REWARDS)


__all__ = [
    "REWARDS",
    "ClassifierReward",
    "ClassifierSettings",
    "EnvReward",
    "LabelReward",
    "RewardedStep",
    "StepReward",
    "make_reward",
    "reward_class",
    "reward_settings",
    "reward_names",
]
