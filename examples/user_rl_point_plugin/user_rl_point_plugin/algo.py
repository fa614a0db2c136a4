"""ALGORITHM: REDQ, randomized ensembled double Q-learning (Chen et al., 2021).

SAC with an ensemble of N critics instead of two: each update's target takes the minimum over M of
them drawn at random, and the actor maximises their mean. With many updates per env step
(`algo.utd_ratio`) it learns from few steps. Everything else is user-rl's SAC, inherited: the
temperature, the target networks, n-step discounts, checkpoints.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn

from user_rl.algos import SAC, SACSettings
from user_rl.policies.encoders import DictEncoder, mlp


class REDQSettings(SACSettings):
    """The config's `algo` keys for redq: SAC's (gamma, tau, actor_lr, ...) and its own two."""

    num_critics: int = Field(10, ge=1, le=100, description="N: the ensemble's critics")
    target_critics: int = Field(2, ge=1, description="M: critics drawn at random for each update's target")

    @model_validator(mode="after")
    def _draws_from_the_ensemble(self) -> REDQSettings:
        if self.target_critics > self.num_critics:
            raise ValueError(
                f"algo.target_critics: at most num_critics ({self.num_critics}), not {self.target_critics}"
            )
        return self


class QEnsemble(nn.Module):
    """N Q-networks over one observation encoder; `q_of` returns their values as a tuple."""

    def __init__(
        self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, hidden: list[int], count: int, layer_norm: bool
    ) -> None:
        super().__init__()
        self.encoder = DictEncoder(obs_space)
        in_dim = self.encoder.out_dim + int(np.prod(action_space.shape))
        self.qs = nn.ModuleList(mlp(in_dim, hidden, 1, layer_norm) for _ in range(count))

    def forward(self, obs: dict[str, torch.Tensor], action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.q_of(self.encoder(obs), action)

    def q_of(self, features: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = torch.cat([features, action], dim=-1)
        return tuple(q(x) for q in self.qs)


class REDQ(SAC):
    name = "redq"
    Settings = REDQSettings

    def build_critic(
        self, policy: str, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, policy_options: dict
    ) -> nn.Module:
        s = self.settings
        return QEnsemble(obs_space, action_space, policy_options["hidden"], s.num_critics, s.critic_layer_norm)

    def target_q(self, qs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        chosen = torch.randperm(len(qs))[: self.settings.target_critics].tolist()
        return torch.stack([qs[i] for i in chosen]).min(dim=0).values

    def actor_q(self, qs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.stack(qs).mean(dim=0)
