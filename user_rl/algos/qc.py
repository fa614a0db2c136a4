"""Q-chunking (Li, Zhou and Levine, 2025, "Reinforcement Learning with Action Chunking"): online RL
for a flow policy that acts in chunks of H actions, in its best-of-N form (QC).

- The critic values a whole chunk, Q(s_t, a_t..a_{t+H-1}), and backs up over the chunk: the
  target is the H-step discounted reward plus gamma^H times the value of the best of N chunks the
  flow samples at s_{t+H} (fewer steps where the episode ended; only a termination stops the
  bootstrap). Backing up H steps at once is what makes sparse rewards travel fast.
- The flow stays a behaviour policy: flow matching on the executed chunks of every row the policy
  or an intervener acted in (demonstrations included; random warm-up rows are left out). The
  chunks best-of-N chose are among them, so the flow drifts towards what the critic prefers.
  (`policy_row_weight` 0 keeps it a clone of the demonstrations: on reach that gained less.)
- The policy that acts samples N chunks and executes the one the critic values most. The critic
  is part of the actor (`FlowChunkActor.value`), so edges get it with the weights.

Start it from a behaviour-cloned flow (`policy.weights`) with the demonstrations attached
(`buffer.attach`), and it improves that policy from the task's reward.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import torch
import torch.nn.functional as F
from pydantic import Field

from user_rl.algos.base import backed_up, imitation_weights, load_parts_state, parts_state, soft_update
from user_rl.algos.optim import adam, critic_adam, step
from user_rl.config_plugins import AlgoSettings
from user_rl.policies import make_actor

# What an algorithm with a chunk critic and a flow it clones reads from a batch (qc, flow_ql).
CHUNK_CRITIC_COLUMNS = (
    "obs",
    "next_obs",
    "reward",
    "terminated",
    "discount",
    "action_chunk",
    "chunk_intervened",
    "chunk_policy_acted",
)


class QCSettings(AlgoSettings):
    """`algo.type: qc`: Q-chunking, online RL for flow chunk policies (best-of-N on a chunk critic)."""

    trains_step_policies = False
    trains_chunk_policies = True
    picks_among_chunks = True
    returns_over_chunks = True

    type: str = "qc"
    tau: float = Field(0.005, gt=0.0, le=1.0)
    actor_lr: float = Field(3e-4, gt=0.0)
    critic_lr: float = Field(3e-4, gt=0.0)
    policy_row_weight: float = Field(
        1.0, ge=0.0, description="the flow's weight on rows the policy acted in (interventions weigh 1)"
    )


class QChunking:
    name = "qc"
    Settings = QCSettings
    state_parts = ("actor", "critic_target", "actor_optim", "critic_optim")  # the critic is part of the actor
    batch_columns = CHUNK_CRITIC_COLUMNS

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        policy: str = "flow",
        policy_options: dict | None = None,
        settings: QCSettings | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.settings = s = settings or QCSettings()
        self.device = torch.device(device)
        self.actor = make_actor(policy, obs_space, action_space, **(policy_options or {})).to(self.device)
        if getattr(self.actor, "value", None) is None:
            raise ValueError("Q-chunking needs a chunk policy with a critic: policy.type flow with best_of >= 2")
        self.critic = self.actor.value
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        flow = [p for name, p in self.actor.named_parameters() if not name.startswith("value.") and p.requires_grad]
        self.actor_optim = adam(flow, s.actor_lr)
        self.critic_optim = critic_adam(self.critic, s.critic_lr)
        self.updates = 0

    def td_target(self, batch: dict) -> torch.Tensor:
        """H-step reward + discount * (1 - terminated) * Q_target(s', best of N chunks at s')."""
        with torch.no_grad():
            next_obs = batch["next_obs"]
            next_chunk = self.actor.best_chunks(next_obs, self.actor.best_of, self.critic_target)
            next_q = torch.min(*self.critic_target(next_obs, next_chunk.flatten(1)))
            return backed_up(batch, next_q, self.settings.gamma)

    def update(self, batch: dict) -> dict[str, torch.Tensor]:
        """One critic step and one flow-matching step on a batch of chunked transitions."""
        obs = batch["obs"]
        chunks = self.actor.normalize(batch["action_chunk"])
        target = self.td_target(batch)
        q1, q2 = self.critic(obs, chunks.flatten(1))
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        step(self.critic_optim, critic_loss)

        weight = imitation_weights(batch, self.settings.policy_row_weight)
        flow_loss = self.actor.flow_loss(self.actor.encoder(obs), chunks, weight)
        step(self.actor_optim, flow_loss)

        soft_update(self.critic_target, self.critic, self.settings.tau)
        self.updates += 1
        return {"critic_loss": critic_loss.detach(), "flow_loss": flow_loss.detach(), "q": q1.detach().mean()}

    def state_dict(self) -> dict:
        return parts_state(self, self.state_parts)

    def load_state_dict(self, state: dict) -> None:
        load_parts_state(self, state, self.state_parts)
