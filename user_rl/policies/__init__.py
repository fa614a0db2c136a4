"""Policies by name. Edges build the actor from (name, spaces, options) and load weights into it.

| `policy.type` | actor | outputs |
|---|---|---|
| `mlp` | `GaussianActor` (`mlp.py`) | one action per step; its critic is `TwinQCritic` |
| `flow` | `FlowChunkActor` (`flow.py`) | chunks of H actions (flow matching); carries its own chunk critic for best-of-N |

Every actor has `act(obs, deterministic)`; a chunk actor also `act_chunk` and `chunk_length`.
`ChunkRunner` (`chunking.py`) runs either kind one action per step.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from torch import nn

from user_rl.policies.chunking import ChunkRunner, act_chunk, chunk_length
from user_rl.policies.flow import FlowChunkActor
from user_rl.policies.mlp import GaussianActor, TwinQCritic

ACTORS: dict[str, type[nn.Module]] = {"mlp": GaussianActor, "flow": FlowChunkActor}
CRITICS: dict[str, type[nn.Module]] = {"mlp": TwinQCritic}


def make_actor(name: str, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, **options: Any) -> nn.Module:
    if name not in ACTORS:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(ACTORS))}")
    return ACTORS[name](obs_space, action_space, **options)


def make_critic(name: str, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, **options: Any) -> nn.Module:
    if name not in CRITICS:
        raise KeyError(f"policy {name!r} has no separate critic; policies with one: {', '.join(sorted(CRITICS))}")
    return CRITICS[name](obs_space, action_space, **options)


__all__ = ["ACTORS", "CRITICS", "ChunkRunner", "FlowChunkActor", "GaussianActor", "TwinQCritic", "act_chunk",
           "chunk_length", "make_actor", "make_critic"]
