"""A pretrained chunk policy, frozen, with a small actor that steers it: what edges run under
`algo.type: dsrl` and `algo.type: residual` (algos/steering.py trains the small actor).

- `NoiseSteeredActor` (DSRL: Wagenmaker et al., 2025, "Steering Your Diffusion Policy with Latent
  Space RL"): the small actor picks the noise the base denoises from, and the base, which is
  deterministic given its noise, turns it into the chunk. Every chunk the robot executes is one the
  base can produce, so what it learned from demonstrations stays.
- `ResidualChunkActor` (residual RL, as Policy Decorator / ResiP): the small actor adds a bounded
  correction to each action of the base's deterministic chunk.

The base's parameters never receive a gradient (`requires_grad` off), so the learner publishes them
once, as the frozen base part, and each new version carries only the small actor.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from user_rl.policies.mlp import GaussianActor


class SteeredChunk(nn.Module):
    """What both steered actors share: a frozen chunk policy `base`, a Gaussian `steer` actor over a
    latent (`latent_dim` values, tanh-squashed into [-1, 1]), and how a latent becomes the chunk the
    robot executes (`chunk_from`, (B, H, A) in the base's normalised units)."""

    def __init__(
        self,
        base: nn.Module,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        hidden: list[int],
        latent_dim: int,
    ) -> None:
        super().__init__()
        if not hasattr(base, "chunk_length"):
            raise ValueError(f"{type(base).__name__} is not a chunk policy: only chunk policies can be steered")
        self.base = base.requires_grad_(False).eval()
        self.chunk_length, self.action_dim = int(base.chunk_length), int(np.prod(action_space.shape))
        self.latent_dim = int(latent_dim)
        unit = gym.spaces.Box(-1.0, 1.0, (self.latent_dim,), np.float32)
        self.steer = GaussianActor(obs_space, unit, hidden)

    def train(self, mode: bool = True) -> SteeredChunk:
        """Train mode for the small actor only: the base stays in eval mode (no dropout) for good."""
        super().train(mode)
        self.base.eval()
        return self

    def normalize(self, action: torch.Tensor) -> torch.Tensor:
        return self.base.normalize(action)

    def to_robot_units(self, normalised: torch.Tensor) -> torch.Tensor:
        return self.base.to_robot_units(normalised)

    def chunk_from(self, obs: dict[str, torch.Tensor], latent: torch.Tensor) -> torch.Tensor:
        """The normalised chunk (B, H, A) the robot executes when the small actor outputs `latent`."""
        raise NotImplementedError

    @torch.no_grad()
    def act_chunk(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        """A chunk of actions in the robot's units, (B, H, A)."""
        return self.to_robot_units(self.chunk_from(obs, self.steer.act(obs, deterministic)))

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        """The chunk's first action (for callers that step one action at a time)."""
        return self.act_chunk(obs, deterministic)[:, 0]


class NoiseSteeredActor(SteeredChunk):
    """DSRL: the latent, scaled to [-noise_bound, noise_bound], is the noise the base denoises from.

    The base names the noise it starts from (`noise_shape`: rows, one per step it denoises, of that
    step's width) and turns noise (B, rows x width) into the executed chunk deterministically
    (`chunk_from_noise(obs, noise)`): a flow (the VLA's head is one), or LeRobot's diffusion policy
    with a DDIM sampler. With `shared_noise` the latent is one row, repeated for every step (as DSRL
    steers π0): a space as small as one action to search, which on reach still holds the chunks that
    succeed (a greedy choice among 16 such noises per chunk turns a 0.3 base into 1.0)."""

    def __init__(
        self,
        base: nn.Module,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        hidden: list[int],
        noise_bound: float,
        shared_noise: bool = False,
    ) -> None:
        if not hasattr(base, "chunk_from_noise"):
            raise ValueError(
                f"{type(base).__name__} cannot be steered through its noise: it has no chunk_from_noise(obs, noise)"
            )
        rows, width = base.noise_shape
        self.noise_rows = rows if shared_noise else 1
        super().__init__(base, obs_space, action_space, hidden, width if shared_noise else rows * width)
        self.noise_bound = float(noise_bound)

    def chunk_from(self, obs: dict[str, torch.Tensor], latent: torch.Tensor) -> torch.Tensor:
        return self.chunk_from_noise(obs, latent * self.noise_bound)

    def chunk_from_noise(self, obs: dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        """The base's chunk (B, H, A) from `noise` (B, latent_dim): with shared noise, one row repeated."""
        return self.base.chunk_from_noise(obs, noise.repeat(1, self.noise_rows))


class ResidualChunkActor(SteeredChunk):
    """Residual RL: the base's deterministic chunk plus `scale` x the latent (in the base's normalised
    action units), clipped to the robot's action bounds."""

    def __init__(
        self, base: nn.Module, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, hidden: list[int], scale: float
    ) -> None:
        super().__init__(
            base, obs_space, action_space, hidden, int(base.chunk_length) * int(np.prod(action_space.shape))
        )
        self.scale = float(scale)
        bounds = torch.as_tensor(np.stack([action_space.low, action_space.high]), dtype=torch.float32)
        low, high = base.normalize(bounds)  # the robot's bounds in the base's normalised units
        self.register_buffer("normalised_low", low.clone())
        self.register_buffer("normalised_high", high.clone())

    def base_chunk(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The base's own chunk for `obs`, normalised (B, H, A): a fixed function of the observation
        (one that denoises integrates it from zero noise, a flow whatever its best_of)."""
        with torch.no_grad():
            if hasattr(self.base, "chunk_from_noise"):
                first = next(iter(obs.values()))
                return self.base.chunk_from_noise(
                    obs, torch.zeros(len(first), math.prod(self.base.noise_shape), device=first.device)
                )
            return self.base.normalize(self.base.act_chunk(obs, deterministic=True))

    def chunk_from(self, obs: dict[str, torch.Tensor], latent: torch.Tensor) -> torch.Tensor:
        return self.with_correction(self.base_chunk(obs), latent)

    def with_correction(self, base_chunk: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        correction = self.scale * latent.view(len(latent), self.chunk_length, self.action_dim)
        return torch.maximum(torch.minimum(base_chunk + correction, self.normalised_high), self.normalised_low)
