"""Policies by name. Edges build the actor from (name, spaces, options) and load weights into it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from torch import nn

from user_rl.policies.mlp import GaussianActor, TwinQCritic

ACTORS: dict[str, type[nn.Module]] = {"mlp": GaussianActor}
CRITICS: dict[str, type[nn.Module]] = {"mlp": TwinQCritic}


def make_actor(name: str, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, **options: Any) -> nn.Module:
    if name not in ACTORS:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(ACTORS))}")
    return ACTORS[name](obs_space, action_space, **options)


def make_critic(name: str, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, **options: Any) -> nn.Module:
    if name not in CRITICS:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(CRITICS))}")
    return CRITICS[name](obs_space, action_space, **options)


__all__ = ["ACTORS", "CRITICS", "GaussianActor", "TwinQCritic", "make_actor", "make_critic"]
