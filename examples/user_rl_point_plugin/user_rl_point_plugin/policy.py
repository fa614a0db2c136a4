"""POLICY: SAC's Gaussian actor with a residual, LayerNorm trunk instead of a plain MLP.

The actor is what every edge runs and what the learner trains. Subclassing user-rl's
`GaussianActor` keeps everything SAC-family algorithms call (`sample_from`, `act`, the action
scaling); only the trunk, encoded observation in and mean + log-std out, is new.

Its settings (the config's `policy` keys for this type) are `ResidualSettings`: user-rl validates
a config's `policy` section against them when the config loads, and builds the actor with them.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from pydantic import Field, field_validator
from torch import nn

from user_rl.policies import GaussianActor, MLPSettings, TwinQCritic


class ResidualSettings(MLPSettings):
    """`hidden` (from MLPSettings): one residual block per entry, all of one width."""

    residual_scale: float = Field(1.0, gt=0.0, le=1.0, description="each block's output is scaled by this")

    @field_validator("hidden")
    @classmethod
    def _one_width(cls, hidden: list[int]) -> list[int]:
        if not hidden or any(h != hidden[0] for h in hidden):
            raise ValueError("policy.type residual_mlp repeats one width, e.g. [64, 64]")
        return hidden


class ResidualMLP(nn.Module):
    """A linear layer to `width`, then one pre-LayerNorm residual block per entry of `hidden`."""

    def __init__(self, in_dim: int, hidden: list[int], out_dim: int, residual_scale: float) -> None:
        super().__init__()
        width = hidden[0]
        self.first = nn.Linear(in_dim, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
            for _ in hidden
        )
        self.last = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, out_dim))
        self.residual_scale = residual_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        for block in self.blocks:
            x = x + self.residual_scale * block(x)
        return self.last(x)


class ResidualActor(GaussianActor):
    Settings = ResidualSettings  # its policy keys; the actor is built with ResidualSettings(...).options()
    Critic = TwinQCritic  # what algo.type sac trains beside this actor

    def __init__(
        self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, hidden: list[int], residual_scale: float = 1.0
    ) -> None:
        super().__init__(obs_space, action_space, hidden)
        self.trunk = ResidualMLP(self.encoder.out_dim, hidden, 2 * self.action_dim, residual_scale)
