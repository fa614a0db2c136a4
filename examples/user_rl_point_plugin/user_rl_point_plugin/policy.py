"""POLICY: SAC's Gaussian actor with a residual, LayerNorm trunk instead of a plain MLP.

The actor is what every edge runs and what the learner trains. Subclassing user-rl's
`GaussianActor` keeps everything SAC-family algorithms call (`sample_from`, `act`, the action
scaling); only the trunk, encoded observation in and mean + log-std out, is new.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from user_rl.policies import GaussianActor, TwinQCritic


class ResidualMLP(nn.Module):
    """A linear layer to `width`, then one pre-LayerNorm residual block per entry of `hidden`."""

    def __init__(self, in_dim: int, hidden: list[int], out_dim: int) -> None:
        super().__init__()
        width = hidden[0]
        if any(h != width for h in hidden):
            raise ValueError(f"policy.type residual_mlp: policy.hidden repeats one width, e.g. [64, 64]; got {hidden}")
        self.first = nn.Linear(in_dim, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
            for _ in hidden
        )
        self.last = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        for block in self.blocks:
            x = x + block(x)
        return self.last(x)


class ResidualActor(GaussianActor):
    Critic = TwinQCritic  # what algo.type sac trains beside this actor

    def __init__(self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, hidden: list[int]) -> None:
        super().__init__(obs_space, action_space, hidden)
        self.trunk = ResidualMLP(self.encoder.out_dim, hidden, 2 * self.action_dim)
