"""Full fine-tuning of a flow chunk policy with RL: the baseline that DSRL and residual RL avoid.

Diffusion-QL (Wang, Hunt and Zhou, 2023, "Diffusion Policies as an Expressive Policy Class for
Offline RL"), on a flow: every weight of the flow moves, by two losses together.

- Flow matching on the executed chunks of the rows the policy or an intervener acted in (as `qc`
  does), which keeps the flow near what it and the people did;
- minus `q_weight` x Q_A(s, flow(s, z)), the chunk critic's value of a chunk the flow integrates
  from fresh noise z, differentiated through the integration into the flow's weights. As in
  Diffusion-QL the value is divided by its batch's mean magnitude, so `q_weight` means the same
  whatever the scale of the rewards.

The critic is `dsrl`'s and `residual`'s Q_A (a twin critic over the executed chunk, backed up over
it), with the flow's own chunk from fresh noise in its target. It stays on the learner: what edges
get after each update is the whole flow, which is the cost this baseline shows next to steering.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import torch
import torch.nn.functional as F
from pydantic import Field

from user_rl.algos.base import (
    backed_up,
    chunk_critic,
    frozen,
    imitation_weights,
    load_parts_state,
    parts_state,
    soft_update,
)
from user_rl.algos.optim import adam, critic_adam, step
from user_rl.algos.qc import CHUNK_CRITIC_COLUMNS
from user_rl.config_plugins import AlgoSettings, PolicySettings
from user_rl.policies import make_actor


class FlowQLSettings(AlgoSettings):
    """`algo.type: flow_ql`: fine-tune a whole flow chunk policy up a chunk critic, near its data by flow matching."""

    trains_step_policies = False
    trains_chunk_policies = True
    returns_over_chunks = True

    type: str = "flow_ql"
    tau: float = Field(0.005, gt=0.0, le=1.0)
    actor_lr: float = Field(3e-4, gt=0.0)
    critic_lr: float = Field(3e-4, gt=0.0)
    q_weight: float = Field(
        1.0, ge=0.0, description="how hard the flow climbs the critic against flow matching (Diffusion-QL's eta)"
    )
    policy_row_weight: float = Field(
        1.0, ge=0.0, description="the flow matching's weight on rows the policy acted in (interventions weigh 1)"
    )
    critic_hidden: list[int] = Field(default_factory=lambda: [256, 256], description="the critic's hidden layers")

    @classmethod
    def suits(cls, policy: type[PolicySettings]) -> bool:
        return policy.chunked and policy.samples_chunks  # a flow it can integrate and differentiate: flow, vla


class FlowQL:
    name = "flow_ql"
    Settings = FlowQLSettings
    state_parts = ("actor", "critic", "critic_target", "actor_optim", "critic_optim")
    batch_columns = CHUNK_CRITIC_COLUMNS

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        policy: str = "flow",
        policy_options: dict | None = None,
        settings: FlowQLSettings | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.settings = s = settings or FlowQLSettings()
        self.device = torch.device(device)
        self.actor = make_actor(policy, obs_space, action_space, **(policy_options or {})).to(self.device)
        if not hasattr(self.actor, "sample_from") or getattr(self.actor, "value", None) is not None:
            raise ValueError("flow_ql fine-tunes a flow chunk policy sampling one chunk: policy.type flow, best_of 1")
        critic = chunk_critic(obs_space, self.actor.chunk_length, self.actor.action_dim, s.critic_hidden)
        self.critic = critic.to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optim = adam([p for p in self.actor.parameters() if p.requires_grad], s.actor_lr)
        self.critic_optim = critic_adam(self.critic, s.critic_lr)
        self.updates = 0

    def td_target(self, batch: dict) -> torch.Tensor:
        """H-step reward + discount x (1 - terminated) x Q_target(s', a chunk the flow samples at s')."""
        with torch.no_grad():
            next_obs = batch["next_obs"]
            next_chunk = self.actor.sample_from(self.actor.encoder(next_obs)).flatten(1)
            return backed_up(batch, torch.min(*self.critic_target(next_obs, next_chunk)), self.settings.gamma)

    def update(self, batch: dict) -> dict[str, torch.Tensor]:
        """One critic step, then one step of the whole flow: flow matching minus the normalised value of its chunks."""
        obs = batch["obs"]
        chunks = self.actor.normalize(batch["action_chunk"][:, : self.actor.chunk_length])
        target = self.td_target(batch)
        q1, q2 = self.critic(obs, chunks.flatten(1))
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        step(self.critic_optim, critic_loss)

        weight = imitation_weights(batch, self.settings.policy_row_weight)[:, : self.actor.chunk_length]
        features = self.actor.encoder(obs)
        flow_loss = self.actor.flow_loss(features, chunks, weight)
        with frozen(self.critic):  # the flow's loss moves the flow only
            q_own = torch.min(*self.critic(obs, self.actor.sample_from(features).flatten(1)))
            q_loss = -q_own.mean() / q_own.abs().mean().detach().clamp(min=1e-6)
            step(self.actor_optim, flow_loss + self.settings.q_weight * q_loss)

        soft_update(self.critic_target, self.critic, self.settings.tau)
        self.updates += 1
        return {
            "critic_loss": critic_loss.detach(),
            "flow_loss": flow_loss.detach(),
            "q": q1.detach().mean(),
            "q_own": q_own.detach().mean(),
        }

    def state_dict(self) -> dict:
        return parts_state(self, self.state_parts)

    def load_state_dict(self, state: dict) -> None:
        load_parts_state(self, state, self.state_parts)
