"""Learning algorithms by name: the one registry the learner picks `algo.type` from.

    settings = cfg.algo                         # the run's algo section: an instance of SAC's Settings
    algo = make_algo("sac", obs_space, action_space, "mlp", {"hidden": [256, 256]}, settings)

| `algo.type` | class | learns from |
|---|---|---|
| `sac` | `SAC` | rewards; with `critic_layer_norm`, a high `utd_ratio` and `buffer.mix` it is RLPD / HIL-SERL |
| `drq` | `DrQ` | rewards, from pixels: SAC with one camera encoder (the critic's) and random-shift augmentation |
| `bc` | `BehaviourCloning` | the actions of people (and the scripted intervener): HG-DAgger; MLP or flow chunks |
| `qc` | `QChunking` | rewards, for a flow chunk policy: a chunk critic picks the best of N sampled chunks (QC) |
| `dsrl` | `DSRL` | rewards, for a frozen flow chunk policy: a small actor picks the noise it starts from (DSRL) |
| `residual` | `Residual` | rewards, for a frozen chunk policy: a small actor adds a bounded correction to its chunks |
| `flow_ql` | `FlowQL` | rewards, for a flow chunk policy: every weight fine-tuned up a chunk critic (Diffusion-QL) |

To add one here: a class with the interface of `base.Algorithm`, whose `Settings` (an
`AlgoSettings` subclass next to it) holds its keys of the config's `algo` section and declares the
policies it trains, and one line in `ALGOS`. Another installed package adds one without touching
this repository, through the `user_rl.algos` entry-point group (user_rl/plugins.py;
docs/guides/add-an-algorithm.md), the same way.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn

from user_rl.algos.base import Algorithm, check_state_is_for, metrics_to_floats
from user_rl.algos.bc import BCSettings, BehaviourCloning
from user_rl.algos.drq import DrQ, DrQSettings
from user_rl.algos.flow_ql import FlowQL, FlowQLSettings
from user_rl.algos.qc import QChunking, QCSettings
from user_rl.algos.sac import SAC, SACSettings
from user_rl.algos.steering import DSRL, DSRLSettings, Residual, ResidualSettings
from user_rl.config_plugins import AlgoSettings, one_of
from user_rl.plugins import ALGOS as ALGO_GROUP
from user_rl.plugins import builtin_or_plugin, known_names
from user_rl.policies import make_actor
from user_rl.policies.encoders import is_image

ALGOS: dict[str, type] = {
    "sac": SAC,
    "drq": DrQ,
    "bc": BehaviourCloning,
    "qc": QChunking,
    "dsrl": DSRL,
    "residual": Residual,
    "flow_ql": FlowQL,
}


def algo_names() -> list[str]:
    """Built-in algorithms and those installed packages add (entry-point group `user_rl.algos`)."""
    return known_names(ALGO_GROUP, ALGOS)


def algo_class(name: str) -> type:
    return builtin_or_plugin(ALGO_GROUP, ALGOS, name, "algorithm")


def algo_settings(name: str) -> type:
    """The settings class of algorithm `name` (its `Settings`)."""
    return algo_class(name).Settings


def make_algo(
    name: str,
    obs_space: gym.spaces.Dict,
    action_space: gym.spaces.Box,
    policy: str = "mlp",
    policy_options: dict | None = None,
    settings: Any = None,
    device: str | torch.device = "cpu",
) -> Algorithm:
    """Build algorithm `name` (settings: its `Settings`, or None for the defaults)."""
    cls = algo_class(name)
    if settings is not None and not isinstance(settings, cls.Settings):
        raise TypeError(f"algorithm {name!r} takes {cls.Settings.__name__}, not {type(settings).__name__}")
    if cls.Settings.needs_cameras and not any(is_image(space) for space in obs_space.spaces.values()):
        others = [other for other, built_in in ALGOS.items() if not built_in.Settings.needs_cameras]
        raise ValueError(
            f"algo.type {name} learns from camera images, and this robot's observations have none "
            f"({', '.join(sorted(obs_space.spaces))}): use algo.type {one_of(others)}"
        )
    return cls(obs_space, action_space, policy, policy_options, settings, device)


def make_run_actor(
    policy: Any, algo: AlgoSettings, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box
) -> nn.Module:
    """What acts on the robot in a run (edges, the evaluator, a checkpoint's evaluation): the `policy`
    section's actor, as the `algo` section's algorithm runs it (a steering algorithm wraps it)."""
    actor = make_actor(policy.type, obs_space, action_space, **policy.options())
    return algo.acting_actor(actor, obs_space, action_space)


__all__ = [
    "ALGOS",
    "Algorithm",
    "BCSettings",
    "BehaviourCloning",
    "DrQ",
    "DrQSettings",
    "DSRL",
    "DSRLSettings",
    "FlowQL",
    "FlowQLSettings",
    "QCSettings",
    "QChunking",
    "Residual",
    "ResidualSettings",
    "SAC",
    "SACSettings",
    "algo_class",
    "algo_names",
    "algo_settings",
    "AlgoSettings",
    "check_state_is_for",
    "make_algo",
    "make_run_actor",
    "metrics_to_floats",
]
