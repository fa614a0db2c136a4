"""Policies by name. Edges build the actor from (name, spaces, options) and load weights into it.

| `policy.type` | actor | outputs |
|---|---|---|
| `mlp` | `GaussianActor` (`mlp.py`) | one action per step; its critic is `TwinQCritic` |
| `flow` | `FlowChunkActor` (`flow.py`) | chunks of H actions (flow matching); carries its own chunk critic for best-of-N |
| `vla` | `VLAChunkActor` (`vla.py`) | the same chunks from images + an instruction + state, through a transformer |
| `lerobot` | `LeRobotChunkActor` (`lerobot_policy.py`) | a LeRobot ACT or diffusion policy's chunks (needs `user-rl[lerobot]`, imported only when asked for) |

Every actor has `act(obs, deterministic)`; a chunk actor also `act_chunk`, `chunk_length` (actions
executed per inference) and `imitation_loss` (what `algo.type: bc` minimises).
`make_actor(..., freeze=[prefix, ...])` keeps the parameters whose names start so fixed.
`ChunkRunner` (`chunking.py`) runs either kind one action per step.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym
from torch import nn

from user_rl.policies.chunking import ChunkRunner, act_chunk, chunk_length
from user_rl.policies.flow import FlowChunkActor
from user_rl.policies.mlp import GaussianActor, TwinQCritic
from user_rl.policies.vla import VLAChunkActor

ACTORS: dict[str, type[nn.Module] | str] = {"mlp": GaussianActor, "flow": FlowChunkActor, "vla": VLAChunkActor,
                                           "lerobot": "user_rl.policies.lerobot_policy:LeRobotChunkActor"}
CRITICS: dict[str, type[nn.Module]] = {"mlp": TwinQCritic}


def make_actor(name: str, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box,
               freeze: list[str] | tuple[str, ...] = (), **options: Any) -> nn.Module:
    if name not in ACTORS:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(ACTORS))}")
    actor = actor_class(name)(obs_space, action_space, **options)
    freeze_parameters(actor, freeze)
    return actor


def actor_class(name: str) -> type[nn.Module]:
    """The class of a policy type; one named "module:Class" is imported on first use (optional extras)."""
    found = ACTORS[name]
    if isinstance(found, str):
        module, _, attribute = found.partition(":")
        found = getattr(importlib.import_module(module), attribute)
    return found


def freeze_parameters(module: nn.Module, prefixes: list[str] | tuple[str, ...]) -> None:
    """Keep the parameters whose names start with a prefix fixed (no gradient, so no optimiser step)."""
    names = [name for name, _ in module.named_parameters()]
    for prefix in prefixes:
        matched = [name for name in names if name == prefix or name.startswith(prefix + ".")]
        if not matched:
            roots = sorted({name.split(".")[0] for name in names})
            raise ValueError(f"freeze: no parameter is named {prefix!r} or {prefix}.*; this policy's parts: "
                             f"{', '.join(roots)}")
        for name, parameter in module.named_parameters():
            if name in matched:
                parameter.requires_grad_(False)


def make_critic(name: str, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, **options: Any) -> nn.Module:
    if name not in CRITICS:
        raise KeyError(f"policy {name!r} has no separate critic; policies with one: {', '.join(sorted(CRITICS))}")
    return CRITICS[name](obs_space, action_space, **options)


__all__ = ["ACTORS", "CRITICS", "ChunkRunner", "FlowChunkActor", "GaussianActor", "TwinQCritic", "VLAChunkActor",
           "act_chunk", "actor_class", "chunk_length", "freeze_parameters", "make_actor", "make_critic"]
