"""What every learning algorithm offers the trainer process, and the helpers they share.

The trainer (`cloud/trainer.py`) knows an algorithm only through this interface, so adding one
means writing a class like `SAC` or `BehaviourCloning` and naming it in `ALGOS`
(`user_rl/algos/__init__.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Protocol

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from user_rl.policies.mlp import TwinQCritic


class Algorithm(Protocol):
    """One learning algorithm.

    - `name`: its `algo.type`. `Settings`: its settings class (an `AlgoSettings` subclass): the
      keys of the config's `algo` section for this type, and what it declares about the policies
      it trains (`trains_chunk_policies`, ...); a run's `cfg.algo` is an instance of it.
    - `batch_columns`: the batch columns `update` reads. "obs" and "next_obs" stand for every
      obs/* (next_obs/*) column; "discount" is there only for n-step returns; "intervened" and
      "policy_acted" (float32, 1.0 or 0.0) are derived by the learner from the row's actor.
    - `actor`: the network edges run (its `state_dict` is what gets published).
    - `updates`: batches taken by `update` so far (restored by `load_state_dict`).
    - `state_dict()` holds "actor" (the learner publishes it on resume) and "algo" (the name).
    """

    name: ClassVar[str]
    Settings: ClassVar[type]
    batch_columns: ClassVar[tuple[str, ...]]
    actor: nn.Module
    updates: int

    def update(self, batch: dict) -> dict[str, torch.Tensor]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def check_state_is_for(state: dict, name: str) -> None:
    """Refuse a state written by another algorithm (states from before the registry are SAC's)."""
    written_by = state.get("algo", "sac")
    if written_by != name:
        raise ValueError(
            f"this state was written by algorithm {written_by!r}, not {name!r}: "
            f"set algo.type: {written_by} to continue it, or start a new run"
        )


def parts_state(algo: Any, parts: tuple[str, ...]) -> dict:
    """`state_dict()` of an algorithm made of the named `parts`: networks and optimisers (their own
    state dicts) and tensors (a CPU copy), with its name and update count."""
    state: dict = {"algo": algo.name}
    for name in parts:
        part = getattr(algo, name)
        state[name] = part.detach().cpu() if isinstance(part, torch.Tensor) else part.state_dict()
    return {**state, "updates": algo.updates}


# How an optimiser runs here, not what it learned: a state saved by a learner replaying CUDA graphs has
# capturable Adam (graphed.py), which a CPU learner cannot step, so loading keeps this process's own.
RUNTIME_FLAGS = ("capturable", "fused", "foreach", "differentiable")


def load_parts_state(algo: Any, state: dict, parts: tuple[str, ...]) -> None:
    """Restore what `parts_state` saved (refusing a state another algorithm wrote); optimisers keep their
    `RUNTIME_FLAGS`, so a GPU run's checkpoint resumes on a CPU and the other way round."""
    check_state_is_for(state, algo.name)
    for name in parts:
        part = getattr(algo, name)
        if isinstance(part, torch.Tensor):
            with torch.no_grad():
                part.copy_(state[name])
        elif isinstance(part, torch.optim.Optimizer):
            own = [{flag: group[flag] for flag in RUNTIME_FLAGS if flag in group} for group in part.param_groups]
            part.load_state_dict(state[name])
            for group, flags in zip(part.param_groups, own):
                group.update(flags)
        else:
            part.load_state_dict(state[name])
    algo.updates = int(state["updates"])


@contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """`module`'s parameters take no gradient inside (an actor's loss through a critic moves the actor only):
    its backward pass then skips the weight gradients it would have thrown away, a third of that critic's
    backward. Each parameter gets back the `requires_grad` it had."""
    trained = [p for p in module.parameters() if p.requires_grad]
    for parameter in trained:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in trained:
            parameter.requires_grad_(True)


@torch.no_grad()
def soft_update(target: torch.nn.Module, source: torch.nn.Module, tau: float) -> None:
    """Polyak-average the target network towards its source: target <- target + tau (source - target), as one
    fused kernel over all the parameters (a loop launched one per tensor)."""
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def metrics_to_floats(metrics: dict[str, Any]) -> dict[str, float]:
    """Plain floats for a status or a log line (this is where the host waits for the device)."""
    return {name: float(value) for name, value in metrics.items()}


def trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimiser steps: all but the frozen ones (`policy.freeze`)."""
    return [parameter for parameter in module.parameters() if parameter.requires_grad]


def backed_up(batch: dict, next_value: torch.Tensor, gamma: float) -> torch.Tensor:
    """A critic's target per row: reward + discount x (1 - terminated) x `next_value`. `discount` is
    the row's own column when there is one (gamma ** n over an n-step or chunk backup), else `gamma`."""
    discount = batch["discount"].unsqueeze(-1) if "discount" in batch else gamma
    not_done = 1.0 - batch["terminated"].float().unsqueeze(-1)
    return batch["reward"].unsqueeze(-1) + discount * not_done * next_value


def imitation_weights(batch: dict, policy_row_weight: float, prefix: str = "chunk_") -> torch.Tensor:
    """What behaviour cloning weighs each row (or each action of a row's chunk) by: 1 where someone
    intervened, `policy_row_weight` where the policy acted, 0 for the rest (random warm-up)."""
    return batch[prefix + "intervened"].float() + policy_row_weight * batch[prefix + "policy_acted"].float()


def chunk_critic(obs_space: gym.spaces.Dict, chunk_length: int, action_dim: int, hidden: list[int]) -> TwinQCritic:
    """Q_A(s, chunk): a twin critic over the chunk a robot executed, normalised and flattened (H x A
    values), as dsrl, residual and flow_ql value it."""
    chunk_space = gym.spaces.Box(-1.0, 1.0, (chunk_length * action_dim,), np.float32)
    return TwinQCritic(obs_space, chunk_space, hidden, layer_norm=True)
