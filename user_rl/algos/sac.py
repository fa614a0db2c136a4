"""Soft actor-critic (Haarnoja et al., 2018) with an ensemble of critics and a learned temperature.

`update` reads top to bottom like a single-file reference: critic, actor, temperature,
target networks. The learner service calls it; it knows nothing of sockets or buffers.

The critics are one vectorised ensemble (`QEnsemble`) of `num_critics` Q-networks, two by
default: the target is the minimum of `target_critics` of them drawn at random each update (two of
two: clipped double Q), and the actor maximises the smaller of two, or the mean of a larger
ensemble. Ten critics with targets from two is the ensemble of RLPD and REDQ.

The RLPD / HIL-SERL recipe (Ball et al., 2023; Luo et al., 2024) is this SAC with these settings:
LayerNorm in the critics' hidden layers (`critic_layer_norm`, which keeps the Q-values from
running away when each sample is replayed many times), an ensemble of critics (`num_critics`),
a high update-to-data ratio (`algo.utd_ratio`), and interventions or demonstrations sampled at a
fixed share of every batch (`buffer.mix`). An intervention row is an ordinary transition here, so
the same row serves SAC and behaviour cloning.

A variant with other Q-networks or other uses of them overrides `build_critic`, `target_q` and
`actor_q`, and keeps the rest (examples/user_rl_point_plugin/user_rl_point_plugin/algo.py).
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from user_rl.algos.base import backed_up, frozen, load_parts_state, parts_state, soft_update
from user_rl.algos.optim import adam, critic_adam, step
from user_rl.config_plugins import AlgoSettings
from user_rl.policies import make_actor, make_critic


class SACSettings(AlgoSettings):
    """`algo.type: sac` (RLPD with critic_layer_norm, a high utd_ratio and buffer.mix)."""

    type: str = "sac"
    tau: float = Field(0.005, gt=0.0, le=1.0)
    actor_lr: float = Field(3e-4, gt=0.0)
    critic_lr: float = Field(3e-4, gt=0.0)
    init_alpha: float = Field(0.1, gt=0.0)
    target_entropy_scale: float = 1.0
    critic_layer_norm: bool = Field(False, description="LayerNorm in the critics' hidden layers (RLPD)")
    num_critics: int = Field(2, ge=1, le=100, description="Q-networks in the critic ensemble (RLPD, REDQ: 10)")
    target_critics: int = Field(
        2, ge=1, description="critics drawn at random each update whose minimum is the target (RLPD, REDQ: 2)"
    )

    @model_validator(mode="after")
    def _draws_from_the_ensemble(self) -> SACSettings:
        check_ensemble(self)
        return self


def check_ensemble(settings: SACSettings) -> None:
    """The target's critics are drawn from the ensemble, so there can be no more of them than it has."""
    if settings.target_critics > settings.num_critics:
        raise ValueError(
            f"algo.target_critics: at most num_critics ({settings.num_critics}), not {settings.target_critics}"
        )


def as_ensemble(qs: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """A critic's values as one tensor [E, B, 1] (a plugin's critic may give a tuple of [B, 1])."""
    return qs if isinstance(qs, torch.Tensor) else torch.stack(qs)


class SAC:
    name = "sac"
    Settings = SACSettings
    batch_columns = ("obs", "next_obs", "action", "reward", "terminated", "discount")
    state_parts = ("actor", "critic", "critic_target", "log_alpha", "actor_optim", "critic_optim", "alpha_optim")

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        policy: str = "mlp",
        policy_options: dict | None = None,
        settings: SACSettings | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.settings = s = settings or SACSettings()
        check_ensemble(s)  # settings built unchecked (`model_construct`) too
        self.device = torch.device(device)
        options = policy_options or {}
        self.actor = make_actor(policy, obs_space, action_space, **options).to(self.device)
        self.critic = self.build_critic(policy, obs_space, action_space, options).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(np.log(s.init_alpha), device=self.device, requires_grad=True)
        self.target_entropy = -s.target_entropy_scale * float(np.prod(action_space.shape))
        self.actor_optim = adam(self.actor.parameters(), s.actor_lr)
        self.critic_optim = critic_adam(self.critic, s.critic_lr)
        self.alpha_optim = adam([self.log_alpha], s.actor_lr)
        self.updates = 0

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp()

    def build_critic(
        self, policy: str, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, policy_options: dict
    ) -> nn.Module:
        """The policy's critic: `num_critics` Q-networks as wide as the actor (`hidden`; its other options are
        the actor's own); `q_of(features, action)` gives their values [E, B, 1]."""
        s = self.settings
        ensemble = {} if s.num_critics == 2 else {"num_critics": s.num_critics}  # a plugin critic of two needs none
        hidden = policy_options["hidden"]
        return make_critic(policy, obs_space, action_space, hidden=hidden, layer_norm=s.critic_layer_norm, **ensemble)

    def target_q(self, qs: torch.Tensor) -> torch.Tensor:
        """The target critics' value of (s', a') from their values [E, B, 1]: the minimum over
        `target_critics` of them drawn at random (drawn on the device: the host never waits); over
        two of two, clipped double Q, with nothing drawn."""
        count = self.settings.target_critics
        if count < len(qs):
            qs = qs.index_select(0, torch.rand(len(qs), device=qs.device).topk(count).indices)
        return qs.min(0).values

    def actor_q(self, qs: torch.Tensor) -> torch.Tensor:
        """The value the actor's loss maximises: the smaller of two critics' (clipped double Q), or
        the mean of a larger ensemble (RLPD, REDQ)."""
        return qs.mean(0) if len(qs) > 2 else qs.min(0).values

    def td_target(self, batch: dict, next_obs: dict | None = None) -> torch.Tensor:
        """The critics' regression target per row: r + discount * (1 - terminated) * soft V(s').

        `discount` is the row's own column when there is one (gamma ** n for n-step returns),
        else gamma. Only a real termination stops bootstrapping; a time-limit truncation does not.
        V(s') = `target_q` of the target critics at a' ~ pi(s') minus alpha * log pi(a' | s').
        """
        with torch.no_grad():
            next_obs = batch["next_obs"] if next_obs is None else next_obs
            next_action, next_log_prob = self.actor.sample(next_obs)
            next_q = self.target_q(as_ensemble(self.critic_target(next_obs, next_action)))
            soft_value = next_q - self.alpha * next_log_prob
            return backed_up(batch, soft_value, self.settings.gamma)

    def update(self, batch: dict) -> dict[str, torch.Tensor]:
        """One gradient step on a batch of tensors: obs, action, reward, next_obs, terminated.

        An optional `discount` per row (gamma ** n for n-step returns) replaces `gamma`.
        The metrics come back as detached 0-d tensors on the training device: reading them
        (`metrics_to_floats`) waits for the device, so the caller does it only when it reports.
        """
        s = self.settings
        obs, next_obs = self.view(batch["obs"]), self.view(batch["next_obs"])
        action = self.actor.normalize(batch["action"])
        td_target = self.td_target(batch, next_obs)
        features = self.critic.encoder(obs)
        qs = as_ensemble(self.critic.q_of(features, action))
        critic_loss = len(qs) * F.mse_loss(qs, td_target.expand_as(qs))  # every member's loss, summed
        step(self.critic_optim, critic_loss)

        new_action, log_prob = self.actor.sample_from(self.actor_features(obs, features))
        with frozen(self.critic):  # the actor's loss moves the actor only
            q_new = self.actor_q(as_ensemble(self.critic.q_of(features.detach(), new_action)))
            actor_loss = (self.alpha.detach() * log_prob - q_new).mean()
            step(self.actor_optim, actor_loss)

        alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        step(self.alpha_optim, alpha_loss)

        soft_update(self.critic_target, self.critic, s.tau)
        self.updates += 1
        return {
            "critic_loss": critic_loss.detach(),
            "actor_loss": actor_loss.detach(),
            "alpha": self.alpha.detach(),
            "q": qs[0].detach().mean(),
        }

    def view(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The observations a batch trains on (DrQ shifts its images at random)."""
        return obs

    def actor_features(self, obs: dict[str, torch.Tensor], critic_features: torch.Tensor) -> torch.Tensor:
        """What the actor's head reads in its loss: its own encoder's output (DrQ: the critic's, detached)."""
        return self.actor.encoder(obs)

    def state_dict(self) -> dict:
        return parts_state(self, self.state_parts)

    def load_state_dict(self, state: dict) -> None:
        load_parts_state(self, state, self.state_parts)
