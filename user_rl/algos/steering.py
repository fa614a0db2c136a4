"""Post-training a pretrained chunk policy with RL while its weights stay as they are: DSRL steers
its input noise, residual RL corrects its actions (policies/steering.py has the actors edges run).

Both are SAC over a small actor's latent, with one critic in common: Q_A(s, chunk) values the
chunk the robot executed, normalised and flattened, and backs up over the chunk as Q-chunking does
(the H-step discounted reward, then gamma^H x the value at s_{t+H}; only a termination stops the
bootstrap). Because it values executed chunks, it learns from every row: a person's take-over and
demonstrations included, not only the steps the small actor chose. The next chunk in its target
is the one the small actor would run there, with SAC's entropy bonus on the latent.

- **residual**: the executed chunk is a differentiable function of the latent (base chunk plus the
  scaled latent), so the actor maximises Q_A directly.
- **dsrl** (the noise-aliasing variant of Wagenmaker et al., 2025): the base is a deep flow, and
  differentiating through its integration is what DSRL avoids. A second critic Q_W(s, w) over the
  noise is regressed onto Q_A(s, base(s, w)) at noise drawn from N(0, I) and from the actor, and
  the actor maximises Q_W. Noise the base maps to the same chunk gets the same value (the
  aliasing), and no row needs to record which noise produced it.

Start either from a behaviour-cloned policy (`policy.weights`): the base's weights never change.
"""

from __future__ import annotations

import copy
from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from user_rl.algos.base import backed_up, chunk_critic, frozen, load_parts_state, parts_state, soft_update
from user_rl.algos.optim import adam, critic_adam, step
from user_rl.algos.sac import SAC
from user_rl.config_plugins import AlgoSettings, PolicySettings
from user_rl.policies import make_actor
from user_rl.policies.mlp import TwinQCritic
from user_rl.policies.steering import NoiseSteeredActor, ResidualChunkActor, SteeredChunk


class SteeringSettings(AlgoSettings):
    """What `dsrl` and `residual` share: SAC settings for the small actor and the chunk critic."""

    trains_step_policies: ClassVar[bool] = False
    trains_chunk_policies: ClassVar[bool] = True
    returns_over_chunks: ClassVar[bool] = True
    steers: ClassVar[bool] = True

    tau: float = Field(0.005, gt=0.0, le=1.0)
    actor_lr: float = Field(3e-4, gt=0.0)
    critic_lr: float = Field(3e-4, gt=0.0)
    init_alpha: float = Field(0.1, gt=0.0)
    target_entropy_scale: float = Field(
        0.5, description="target entropy = -scale x the latent's size (H x A values per chunk)"
    )
    steer_hidden: list[int] = Field(default_factory=lambda: [128, 128], description="the small actor's hidden layers")
    critic_hidden: list[int] = Field(default_factory=lambda: [256, 256], description="the critics' hidden layers")


class DSRLSettings(SteeringSettings):
    """`algo.type: dsrl`: a small SAC actor picks the noise a frozen flow policy starts from (DSRL-NA)."""

    type: str = "dsrl"
    noise_bound: float = Field(1.5, gt=0.0, le=5.0, description="the noise the actor picks lies in [-bound, bound]")
    shared_noise: bool = Field(
        False,
        description="steer one row of noise (an action's size) repeated for every step of the chunk, as DSRL "
        "steers π0, instead of the whole chunk's noise: a smaller space, learned in fewer steps",
    )
    through_base: bool = Field(
        False,
        description="move the actor up the chunk critic through the base's denoising (exact, for a small "
        "base) instead of up a noise critic fitted to it (DSRL's noise aliasing, for any base)",
    )

    @classmethod
    def suits(cls, policy: type[PolicySettings]) -> bool:
        return policy.chunked and policy.steerable_by_noise

    def acting_actor(self, base: nn.Module, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> nn.Module:
        return NoiseSteeredActor(base, obs_space, action_space, self.steer_hidden, self.noise_bound, self.shared_noise)


class ResidualSettings(SteeringSettings):
    """`algo.type: residual`: a small SAC actor adds a bounded correction to a frozen chunk policy's actions."""

    type: str = "residual"
    scale: float = Field(
        0.2, gt=0.0, le=2.0, description="the largest correction, in normalised action units ([-1, 1] spans the range)"
    )

    def acting_actor(self, base: nn.Module, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> nn.Module:
        return ResidualChunkActor(base, obs_space, action_space, self.steer_hidden, self.scale)


class ChunkSteering:
    """SAC on a steered chunk policy's small actor, with a critic over executed chunks."""

    name: ClassVar[str]
    Settings: ClassVar[type[SteeringSettings]]
    batch_columns = ("obs", "next_obs", "reward", "terminated", "discount", "action_chunk")
    state_parts = SAC.state_parts

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        policy: str = "flow",
        policy_options: dict | None = None,
        settings: SteeringSettings | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.settings = s = settings or self.Settings()
        self.device = torch.device(device)
        self.obs_space = obs_space
        base = make_actor(policy, obs_space, action_space, **(policy_options or {}))
        self.actor: SteeredChunk = s.acting_actor(base, obs_space, action_space).to(self.device)
        self.pretrained = self.actor.base  # what `policy.weights` loads into
        critic = chunk_critic(obs_space, self.actor.chunk_length, self.actor.action_dim, s.critic_hidden)
        self.critic = critic.to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(np.log(s.init_alpha), device=self.device, requires_grad=True)
        self.target_entropy = -s.target_entropy_scale * self.actor.latent_dim
        self.actor_optim = adam(self.actor.steer.parameters(), s.actor_lr)
        self.critic_optim = critic_adam(self.critic, s.critic_lr)
        self.alpha_optim = adam([self.log_alpha], s.actor_lr)
        self.updates = 0

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp()

    def td_target(self, batch: dict) -> torch.Tensor:
        """H-step reward + discount x (1 - terminated) x soft V(s_{t+H}) under the small actor."""
        with torch.no_grad():
            next_obs = batch["next_obs"]
            latent, log_prob = self.actor.steer.sample(next_obs)
            next_chunk = self.actor.chunk_from(next_obs, latent).flatten(1)
            soft_value = torch.min(*self.critic_target(next_obs, next_chunk)) - self.alpha * log_prob
            return backed_up(batch, soft_value, self.settings.gamma)

    def update(self, batch: dict) -> dict[str, torch.Tensor]:
        """One step for the chunk critic, the algorithm's own (`improve_actor`), the temperature, the targets."""
        obs = batch["obs"]
        # the chunk one inference executes (a LeRobot diffusion policy plans a longer horizon than it runs)
        executed = self.actor.normalize(batch["action_chunk"][:, : self.actor.chunk_length]).flatten(1)
        target = self.td_target(batch)
        features = self.critic.encoder(obs)
        q1, q2 = self.critic.q_of(features, executed)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        step(self.critic_optim, critic_loss)

        latent, log_prob = self.actor.steer.sample(obs)
        metrics = self.improve_actor(obs, features.detach(), latent, log_prob)

        step(self.alpha_optim, -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean())

        soft_update(self.critic_target, self.critic, self.settings.tau)
        self.updates += 1
        return {"critic_loss": critic_loss.detach(), "alpha": self.alpha.detach(), "q": q1.detach().mean(), **metrics}

    def improve_actor(
        self, obs: dict, features: torch.Tensor, latent: torch.Tensor, log_prob: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Move the small actor up Q_A of the chunk its latent makes (which must be differentiable in it:
        residual's base + scale x latent, or DSRL's denoising with `through_base`)."""
        chunk = self.actor.chunk_from(obs, latent).flatten(1)
        with frozen(self.critic):  # the actor's loss moves the actor only
            actor_loss = (self.alpha.detach() * log_prob - torch.min(*self.critic.q_of(features, chunk))).mean()
            step(self.actor_optim, actor_loss)
        return {"actor_loss": actor_loss.detach()}

    def state_dict(self) -> dict:
        return parts_state(self, self.state_parts)

    def load_state_dict(self, state: dict) -> None:
        load_parts_state(self, state, self.state_parts)


class Residual(ChunkSteering):
    """The executed chunk is base + scale x latent: Q_A's gradient reaches the actor directly."""

    name = "residual"
    Settings = ResidualSettings
    actor: ResidualChunkActor


class DSRL(ChunkSteering):
    name = "dsrl"
    Settings = DSRLSettings
    state_parts = (*SAC.state_parts, "noise_critic", "noise_critic_optim")
    actor: NoiseSteeredActor

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.settings.through_base:
            self.state_parts = SAC.state_parts
            return
        noise_space = gym.spaces.Box(-np.inf, np.inf, (self.actor.latent_dim,), np.float32)
        self.noise_critic = TwinQCritic(self.obs_space, noise_space, self.settings.critic_hidden, layer_norm=True).to(
            self.device
        )
        self.noise_critic_optim = critic_adam(self.noise_critic, self.settings.critic_lr)

    def improve_actor(
        self, obs: dict, features: torch.Tensor, latent: torch.Tensor, log_prob: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Fit Q_W(s, w) to Q_A(s, base(s, w)), then move the actor up Q_W (never through the base);
        with `through_base`, up Q_A through the base's denoising instead."""
        if self.settings.through_base:
            return super().improve_actor(obs, features, latent, log_prob)
        bound = self.actor.noise_bound
        with torch.no_grad():  # half the noise from the prior the base was trained on, half where the actor looks
            prior = torch.randn_like(latent[: len(latent) // 2])
            noise = torch.cat([prior, latent[len(prior) :].detach() * bound])
            chunks = self.actor.chunk_from_noise(obs, noise).flatten(1)
            aliased = torch.min(*self.critic.q_of(features, chunks))
        noise_features = self.noise_critic.encoder(obs)
        w1, w2 = self.noise_critic.q_of(noise_features, noise)
        noise_loss = F.mse_loss(w1, aliased) + F.mse_loss(w2, aliased)
        step(self.noise_critic_optim, noise_loss)

        with frozen(self.noise_critic):
            q_noise = torch.min(*self.noise_critic.q_of(noise_features.detach(), latent * bound))
            actor_loss = (self.alpha.detach() * log_prob - q_noise).mean()
            step(self.actor_optim, actor_loss)
        return {"actor_loss": actor_loss.detach(), "noise_critic_loss": noise_loss.detach()}
