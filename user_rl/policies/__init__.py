"""Policies by name. Edges build the actor from (name, spaces, options) and load weights into it.

| `policy.type` | actor | outputs |
|---|---|---|
| `mlp` | `GaussianActor` (`mlp.py`) | one action per step; its critic is `TwinQCritic` (a `QEnsemble`, `ensemble.py`) |
| `flow` | `FlowChunkActor` (`flow.py`) | chunks of H actions (flow matching), with a chunk critic for best-of-N |
| `vla` | `VLAChunkActor` (`vla.py`) | the same chunks from images + an instruction + state, through a transformer |
| `lerobot` | `LeRobotChunkActor` (`lerobot_policy.py`) | a LeRobot ACT, diffusion or SmolVLA policy's chunks |

Every actor has `act(obs, deterministic)`; a chunk actor also `act_chunk`, `chunk_length` (actions
executed per inference) and `imitation_loss` (what `algo.type: bc` minimises).
`make_actor(..., freeze=[prefix, ...])` keeps the parameters whose names start so fixed.
`ChunkRunner` (`chunking.py`) runs either kind one action per step.

Each actor class names its settings in a `Settings` attribute (a `PolicySettings` subclass next to
it: `MLPSettings`, `FlowSettings`, ...): the keys of the config's `policy` section for that type,
and the keyword arguments the actor is built with (`settings.options()`). Adding a policy is its
module and one line in `ACTORS`.

Another installed package adds a policy through the `user_rl.policies` entry-point group
(user_rl/plugins.py; docs/guides/add-a-policy.md): the entry point names an actor class, built as
`cls(obs_space, action_space, **settings.options())` from its own `Settings` (without one it takes
`MLPSettings`: `hidden`). With SAC-family algorithms its class names the critic trained beside it
in a `Critic` attribute (e.g. `Critic = TwinQCritic`).
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym
from torch import nn

from user_rl.plugins import POLICIES, builtin_or_plugin, known_names
from user_rl.policies.chunking import ChunkRunner, act_chunk, chunk_length
from user_rl.policies.ensemble import QEnsemble
from user_rl.policies.flow import FlowChunkActor, FlowSettings
from user_rl.policies.mlp import GaussianActor, MLPSettings, TwinQCritic
from user_rl.policies.vla import VLAChunkActor, VLASettings

ACTORS: dict[str, type[nn.Module] | str] = {
    "mlp": GaussianActor,
    "flow": FlowChunkActor,
    "vla": VLAChunkActor,
    "lerobot": "user_rl.policies.lerobot_policy:LeRobotChunkActor",
}
CRITICS: dict[str, type[nn.Module]] = {"mlp": TwinQCritic}


def make_actor(
    name: str,
    obs_space: gym.spaces.Dict,
    action_space: gym.spaces.Box,
    freeze: list[str] | tuple[str, ...] = (),
    **options: Any,
) -> nn.Module:
    actor = actor_class(name)(obs_space, action_space, **options)
    freeze_parameters(actor, freeze)
    return actor


def policy_names() -> list[str]:
    """Built-in policy types and those installed packages add (entry-point group `user_rl.policies`)."""
    return known_names(POLICIES, ACTORS)


def actor_class(name: str) -> type[nn.Module]:
    """The class of a policy type; one named "module:Class" (an optional extra) or a plugin's is imported
    on first use."""
    found = builtin_or_plugin(POLICIES, ACTORS, name, "policy", KeyError)
    if isinstance(found, str):
        module, _, attribute = found.partition(":")
        found = getattr(importlib.import_module(module), attribute)
    return found


def policy_settings(name: str) -> type:
    """The settings class of a policy type (its actor's `Settings`; `MLPSettings` for a plugin without one)."""
    return getattr(actor_class(name), "Settings", MLPSettings)


def freeze_parameters(module: nn.Module, prefixes: list[str] | tuple[str, ...]) -> None:
    """Keep the parameters whose names start with a prefix fixed (no gradient, so no optimiser step)."""
    names = [name for name, _ in module.named_parameters()]
    for prefix in prefixes:
        matched = [name for name in names if name == prefix or name.startswith(prefix + ".")]
        if not matched:
            roots = sorted({name.split(".")[0] for name in names})
            raise ValueError(
                f"freeze: no parameter is named {prefix!r} or {prefix}.*; this policy's parts: {', '.join(roots)}"
            )
        for name, parameter in module.named_parameters():
            if name in matched:
                parameter.requires_grad_(False)


def make_critic(name: str, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, **options: Any) -> nn.Module:
    """The critic SAC-family algorithms train beside policy `name`'s actor (a plugin's class names it as `Critic`)."""
    critic = CRITICS.get(name) or getattr(actor_class(name), "Critic", None)
    if critic is None:
        raise KeyError(
            f"policy {name!r} has no separate critic; built-in policies with one: {', '.join(sorted(CRITICS))} "
            "(a plugin policy names its own in a `Critic` class attribute)"
        )
    return critic(obs_space, action_space, **options)


__all__ = [
    "ACTORS",
    "CRITICS",
    "ChunkRunner",
    "FlowChunkActor",
    "FlowSettings",
    "GaussianActor",
    "MLPSettings",
    "QEnsemble",
    "TwinQCritic",
    "VLAChunkActor",
    "VLASettings",
    "act_chunk",
    "actor_class",
    "chunk_length",
    "freeze_parameters",
    "make_actor",
    "make_critic",
    "policy_names",
    "policy_settings",
]
