"""A pretrained chunk policy, frozen, with a small actor that steers it: what edges run under
`algo.type: dsrl` and `algo.type: residual` (algos/steering.py trains the small actor).

- `NoiseSteeredActor` (DSRL: Wagenmaker et al., 2025, "Steering Your Diffusion Policy with Latent
  Space RL"): the small actor picks the noise the base's flow starts from, and the base, which is
  deterministic given its noise, turns it into the chunk. Every chunk the robot executes is one the
  base can produce, so what it learned from demonstrations stays.
- `ResidualChunkActor` (residual RL, as Policy Decorator / ResiP): the small actor adds a bounded
  correction to each action of the base's deterministic chunk.

The base's parameters never receive a gradient (`requires_grad` off), so the learner publishes them
once, as the frozen base part, and each new version carries only the small actor.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from user_rl.policies.mlp import GaussianActor


class SteeredChunk(nn.Module):
    """What both steered actors share: a frozen chunk policy `base`, a Gaussian `steer` actor over a
    latent of one value per action of a chunk (H x A, tanh-squashed into [-1, 1]), and how a latent
    becomes the chunk the robot executes (`chunk_from`, in the base's normalised units)."""

    def __init__(self, base: nn.Module, obs_space: gym.spaces.Dict, hidden: list[int]) -> None:
        super().__init__()
        if not hasattr(base, "chunk_length") or not hasattr(base, "action_dim"):
            raise ValueError(f"{type(base).__name__} is not a chunk policy: only chunk policies can be steered")
        self.base = base.requires_grad_(False).eval()
        self.chunk_length, self.action_dim = int(base.chunk_length), int(base.action_dim)
        self.latent_dim = self.chunk_length * self.action_dim
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
    """DSRL: the latent, scaled to [-noise_bound, noise_bound], is the noise the base's flow starts from."""

    def __init__(self, base: nn.Module, obs_space: gym.spaces.Dict, hidden: list[int], noise_bound: float) -> None:
        if not hasattr(base, "sample_from"):
            raise ValueError(
                f"{type(base).__name__} cannot be steered through its noise: it has no sample_from(features, noise)"
            )
        super().__init__(base, obs_space, hidden)
        self.noise_bound = float(noise_bound)

    def chunk_from(self, obs: dict[str, torch.Tensor], latent: torch.Tensor) -> torch.Tensor:
        return self.chunk_from_noise(obs, latent * self.noise_bound)

    def chunk_from_noise(self, obs: dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        """The base's chunk integrated from `noise` (B, H*A): deterministic, so the noise names the chunk."""
        return self.base.sample_from(self.base.encoder(obs), noise)


class ResidualChunkActor(SteeredChunk):
    """Residual RL: the base's deterministic chunk plus `scale` x the latent, clipped to [-1, 1]."""

    def __init__(self, base: nn.Module, obs_space: gym.spaces.Dict, hidden: list[int], scale: float) -> None:
        super().__init__(base, obs_space, hidden)
        self.scale = float(scale)

    def base_chunk(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The base's own chunk for `obs`, normalised (B, H, A): a fixed function of the observation
        (a flow integrates it from zero noise, whatever its best_of)."""
        with torch.no_grad():
            if hasattr(self.base, "sample_from"):
                features = self.base.encoder(obs)
                return self.base.sample_from(
                    features, torch.zeros(len(features), self.latent_dim, device=features.device)
                )
            return self.base.normalize(self.base.act_chunk(obs, deterministic=True))

    def chunk_from(self, obs: dict[str, torch.Tensor], latent: torch.Tensor) -> torch.Tensor:
        return self.with_correction(self.base_chunk(obs), latent)

    def with_correction(self, base_chunk: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        correction = self.scale * latent.view(len(latent), self.chunk_length, self.action_dim)
        return (base_chunk + correction).clamp(-1.0, 1.0)
