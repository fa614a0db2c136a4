"""Gaussian actor and its critic over any dict observation (state vectors and/or cameras).

The actor is what edges run: it outputs actions in the robot's own units, so an edge never
needs the learner's normalisation. The critic sees actions normalised to [-1, 1].
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from pydantic import Field
from torch.distributions import Normal

from user_rl.config_plugins import PolicySettings
from user_rl.policies.encoders import ActionScaling, DictEncoder, mlp
from user_rl.policies.ensemble import QEnsemble

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class MLPSettings(PolicySettings):
    """`policy.type: mlp`: a Gaussian actor (trained by sac, drq, bc). A plugin policy without
    `Settings` of its own takes these."""

    type: str = "mlp"
    hidden: list[int] = Field(default_factory=lambda: [256, 256], description="widths of the hidden layers")


class GaussianActor(ActionScaling):
    Settings = MLPSettings

    def __init__(self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, hidden: list[int]) -> None:
        super().__init__(action_space)
        self.encoder = DictEncoder(obs_space)
        self.action_dim = int(np.prod(action_space.shape))
        self.trunk = mlp(self.encoder.out_dim, hidden, 2 * self.action_dim)

    def distribution(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.distribution_from(self.encoder(obs))

    def distribution_from(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-std from encoded observations (DrQ hands the critic's features in)."""
        mean, log_std = self.trunk(features).chunk(2, dim=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1.0)
        return mean, log_std

    def sample(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised tanh-squashed sample in [-1, 1] and its log-probability."""
        return self.sample_from(self.encoder(obs))

    def sample_from(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.distribution_from(features)
        # std = exp(...) is positive by construction; validating it costs a host sync per call on a GPU
        normal = Normal(mean, log_std.exp(), validate_args=False)
        pre_tanh = normal.rsample()
        squashed = torch.tanh(pre_tanh)
        log_prob = normal.log_prob(pre_tanh) - torch.log(1.0 - squashed.pow(2) + 1e-6)
        return squashed, log_prob.sum(-1, keepdim=True)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        """Actions in the robot's units (what an edge executes)."""
        if deterministic:
            squashed = torch.tanh(self.distribution(obs)[0])
        else:
            squashed = self.sample(obs)[0]
        return self.to_robot_units(squashed)


# The critic every SAC-family algorithm trains beside this actor (and what plugin policies name as
# their `Critic`): an ensemble of Q-networks run as one, two by default (clipped double Q).
TwinQCritic = QEnsemble
