"""A flow-matching policy that outputs chunks of H actions (Lipman et al., 2023; π0's action head).

The network learns a velocity field v(obs, x_t, t) that carries Gaussian noise (t = 0) to a
chunk of normalised actions (t = 1) along straight lines: x_t = (1 - t) x_0 + t x_1, target
velocity x_1 - x_0. Acting integrates it with `flow_steps` Euler steps from fresh noise.

With `best_of` > 1 the actor also carries a chunk critic Q(obs, chunk) (`value`) and acts as
Q-chunking's best-of-N policy (Li, Zhou and Levine, 2025): it samples `best_of` chunks and
executes the one the critic values most. The critic then travels with the actor's weights,
since the edge needs it to choose.

Edges run it through `ChunkRunner` (policies/chunking.py): one inference per chunk.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from pydantic import Field
from torch import nn

from user_rl.config_plugins import PolicySettings
from user_rl.policies.encoders import ActionScaling, DictEncoder, mlp
from user_rl.policies.mlp import TwinQCritic

TIME_FEATURES = 16


class FlowSettings(PolicySettings):
    """`policy.type: flow`: chunks of `chunk` actions (trained by bc, qc)."""

    chunked = True
    samples_chunks = True
    steerable_by_noise = True

    type: str = "flow"
    hidden: list[int] = Field(default_factory=lambda: [256, 256], description="widths of the hidden layers")
    chunk: int = Field(1, ge=1, le=128, description="actions per inferred chunk (H); the edge infers once per chunk")
    flow_steps: int = Field(10, ge=1, le=100, description="Euler steps from noise to a chunk")
    best_of: int = Field(
        1,
        ge=1,
        le=256,
        description="chunks sampled per inference, of which the chunk critic picks one "
        "(Q-chunking; algo qc needs more than 1)",
    )

    @property
    def actions_per_chunk(self) -> int:
        return self.chunk

    @property
    def chunks_sampled(self) -> int:
        return self.best_of


def time_embedding(t: torch.Tensor) -> torch.Tensor:
    """Sinusoidal features of the flow time t in [0, 1] (shape (B, 1) → (B, TIME_FEATURES))."""
    freqs = torch.exp(torch.arange(TIME_FEATURES // 2, device=t.device) * (-math.log(1000.0) / (TIME_FEATURES // 2)))
    angles = t * freqs * 1000.0
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def chunk_space(action_space: gym.spaces.Box, chunk: int) -> gym.spaces.Box:
    """The space of a chunk of `chunk` actions of `action_space` (shape (H, A))."""
    low = np.broadcast_to(action_space.low, (chunk, *action_space.shape))
    high = np.broadcast_to(action_space.high, (chunk, *action_space.shape))
    return gym.spaces.Box(low, high, dtype=action_space.dtype)


class FlowChunkActor(ActionScaling):
    Settings = FlowSettings

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        hidden: list[int],
        chunk: int = 4,
        flow_steps: int = 10,
        best_of: int = 1,
        encoder: nn.Module | None = None,
    ) -> None:
        """`encoder`: what turns observations into one feature vector (`out_dim` wide); default the
        MLP/CNN `DictEncoder`, a transformer backbone for the VLA (`vla.py`)."""
        super().__init__(action_space)
        if len(action_space.shape) != 1:
            raise ValueError(f"the flow policy takes a robot's per-step action vector, not shape {action_space.shape}")
        if chunk < 1 or flow_steps < 1 or best_of < 1:
            raise ValueError(f"chunk, flow_steps and best_of must be >= 1 (got {chunk}, {flow_steps}, {best_of})")
        self.chunk_length, self.flow_steps, self.best_of = chunk, flow_steps, best_of
        self.action_dim = int(action_space.shape[0])
        self.encoder = encoder if encoder is not None else DictEncoder(obs_space)
        flat = chunk * self.action_dim
        self.velocity_net = mlp(self.encoder.out_dim + flat + TIME_FEATURES, hidden, flat)
        self.value = (
            TwinQCritic(obs_space, gym.spaces.Box(-1.0, 1.0, (flat,), np.float32), hidden, layer_norm=True)
            if best_of > 1
            else None
        )

    # -- the flow ------------------------------------------------------------------------------
    def velocity(self, features: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The velocity of flat normalised chunks x_t (B, H*A) at times t (B, 1)."""
        return self.velocity_net(torch.cat([features, x_t, time_embedding(t)], dim=-1))

    def flow_loss(self, features: torch.Tensor, chunks: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Conditional flow matching on normalised chunks (B, H, A); `weights` (B, H) weigh each action
        (0 for one that was not executed in the episode, or that the run does not imitate)."""
        x1 = chunks.flatten(1)
        x0 = torch.randn_like(x1)
        t = torch.rand(len(x1), 1, device=x1.device)
        error = (self.velocity(features, (1 - t) * x0 + t * x1, t) - (x1 - x0)).pow(2)
        per_action = error.view(len(x1), self.chunk_length, self.action_dim).mean(-1)
        return (per_action * weights).sum() / weights.sum().clamp(min=1.0)

    def imitation_loss(
        self, obs: dict[str, torch.Tensor], chunks: torch.Tensor, weights: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """What behaviour cloning minimises: `flow_loss` on these observations (no extra metrics)."""
        return self.flow_loss(self.encoder(obs), chunks, weights), {}

    def sample_from(self, features: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        """Normalised chunks (B, H, A) in [-1, 1], integrated from `noise` (default: fresh Gaussian)."""
        x = (
            torch.randn(len(features), self.chunk_length * self.action_dim, device=features.device)
            if noise is None
            else noise
        )
        dt = 1.0 / self.flow_steps
        for i in range(self.flow_steps):
            t = torch.full((len(x), 1), i * dt, device=x.device)
            x = x + dt * self.velocity(features, x, t)
        return x.clamp(-1.0, 1.0).view(len(x), self.chunk_length, self.action_dim)

    @property
    def noise_shape(self) -> tuple[int, int]:
        """The noise the flow integrates a chunk from (what DSRL steers): a row per action of the chunk."""
        return self.chunk_length, self.action_dim

    def chunk_from_noise(self, obs: dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        """The normalised chunk (B, H, A) integrated from `noise` (B, H*A): deterministic, so the noise names it."""
        return self.sample_from(self.encoder(obs), noise)

    def best_chunks(self, obs: dict[str, torch.Tensor], n: int, critic: nn.Module) -> torch.Tensor:
        """Of `n` sampled chunks per observation, the one `critic` values most (normalised, (B, H, A))."""
        candidates = self.sample_from(self.encoder(obs).repeat_interleave(n, dim=0))
        judged = critic.encoder(obs).repeat_interleave(n, dim=0)  # each observation encoded once, not n times
        values = torch.min(*critic.q_of(judged, candidates.flatten(1)))
        best = values.view(-1, n).argmax(dim=1)
        rows = torch.arange(len(best), device=best.device)  # made on the device: no copy up, which no CUDA graph holds
        return candidates.view(-1, n, self.chunk_length, self.action_dim)[rows, best]

    # -- what edges run ---------------------------------------------------------------------------
    @torch.no_grad()
    def act_chunk(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        """A chunk of actions in the robot's units, (B, H, A). Deterministic: integrated from zero noise
        (best-of-N always samples: its choice is what makes it better than the flow alone)."""
        if self.value is not None:
            normalised = self.best_chunks(obs, self.best_of, self.value)
        else:
            features = self.encoder(obs)
            noise = (
                torch.zeros(len(features), self.chunk_length * self.action_dim, device=features.device)
                if deterministic
                else None
            )
            normalised = self.sample_from(features, noise)
        return self.to_robot_units(normalised)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        """The chunk's first action (for callers that step one action at a time)."""
        return self.act_chunk(obs, deterministic)[:, 0]
