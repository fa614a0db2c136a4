"""Intervention-weighted behaviour cloning; with the default weights it is HG-DAgger.

HG-DAgger (Kelly et al., 2019): the policy drives, a person (or the scripted intervener in
simulation) takes over when it goes wrong, and the policy learns to do what the person did in
the states the policy itself led to. Every row is weighted: 1 where someone intervened
(`intervened`), `policy_row_weight` where the policy acted (`policy_acted`; 0 by default, which
is HG-DAgger), and 0 for anything else (random warm-up actions). A positive `policy_row_weight`
also keeps the policy's own accepted actions, as in intervention-weighted regression
(Mandlekar et al., 2020).

The loss per row is the negative log-likelihood of the demonstrated action under the actor's
Gaussian (before the tanh squash) plus the squared error of the deterministic action, both in
the normalised [-1, 1] action units:
- the likelihood trains the standard deviation too, so the actions the edge samples while it
  collects data spread as much as the people's own actions do, not as much as an untrained one;
- the squared error is on exactly what an evaluation runs (tanh of the mean), and stays well
  scaled at the action bounds, where the pre-tanh target of a clipped action is large.
The tanh's log-Jacobian depends only on the target action, so it is left out of the likelihood.

A chunk policy (`policy.type: flow`, `vla` or `lerobot`) imitates each row's next H executed
actions instead (`action_chunk`) through its own `imitation_loss` (flow matching; a LeRobot
policy's own loss), with a weight per action from who executed it, so a chunk that a hand-back or
the episode's end cut short teaches only what was demonstrated.

Rows of weight 0 are dropped before the forward pass, so they cannot change the policy; a batch
with no weighted row makes no optimiser step at all (Adam would still move the weights on its
momentum), but it counts in `updates`, which counts the batches taken.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from pydantic import Field
from torch.distributions import Normal

from user_rl.algos.base import imitation_weights, load_parts_state, parts_state, trainable
from user_rl.algos.optim import adam, step
from user_rl.config_plugins import AlgoSettings
from user_rl.policies import make_actor

# The likelihood's target for an action at a bound is atanh(0.99) = 2.6, not infinity. (Nearer 1 the
# pre-tanh target of the many clipped actions a person or an expert gives grows so steep that it
# slowed learning on the rest: the squared error still pulls the action the rest of the way.)
TARGET_EDGE = 0.99


class BCSettings(AlgoSettings):
    """`algo.type: bc`: behaviour cloning of interventions (HG-DAgger; mlp or chunk policies)."""

    trains_chunk_policies = True

    type: str = "bc"
    actor_lr: float = Field(3e-4, gt=0.0)
    policy_row_weight: float = Field(
        0.0,
        ge=0.0,
        description="weight of rows where the policy acted in what it imitates (interventions weigh 1); "
        "0: HG-DAgger (learn from interventions only)",
    )


class BehaviourCloning:
    name = "bc"
    Settings = BCSettings
    not_graphable = "it picks the rows to imitate on the host (a batch with none takes no step at all)"
    batch_columns = (
        "obs",
        "action",
        "intervened",
        "policy_acted",
        "action_chunk",
        "chunk_intervened",
        "chunk_policy_acted",
    )  # the chunk_ columns: for a chunk policy (in its runs' batches only)

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        policy: str = "mlp",
        policy_options: dict | None = None,
        settings: BCSettings | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.settings = settings or BCSettings()
        if self.settings.policy_row_weight < 0:
            raise ValueError(f"policy_row_weight must be >= 0, not {self.settings.policy_row_weight}")
        self.device = torch.device(device)
        self.actor = make_actor(policy, obs_space, action_space, **(policy_options or {})).to(self.device)
        self.actor_optim = adam(trainable(self.actor), self.settings.actor_lr)
        self.chunked = hasattr(self.actor, "imitation_loss")
        self.updates = 0
        self._last: dict[str, torch.Tensor] = {}

    def row_weights(self, batch: dict) -> torch.Tensor:
        """1 for intervention rows, `policy_row_weight` for the policy's rows, 0 for the rest
        (for a chunk policy: per action of each row's chunk, (B, H))."""
        prefix = "chunk_" if self.chunked else ""
        if self.chunked and prefix + "intervened" not in batch:
            raise KeyError(
                "a chunk policy learns from action chunks: the batch needs action_chunk and "
                "chunk_intervened (buffer.action_horizon = policy.chunk)"
            )
        return imitation_weights(batch, self.settings.policy_row_weight, prefix)

    def update(self, batch: dict) -> dict[str, torch.Tensor]:
        """One gradient step towards the weighted rows' actions: obs, action, intervened, policy_acted.

        Metrics: `bc_loss` (the weighted loss), `action_nll` and `action_mse` (weighted means of
        its two parts), `imitated_rows` (rows of the batch with a weight above 0). A chunk policy
        reports its loss as `bc_loss`, with the parts its `imitation_loss` names (ACT: l1_loss, kld_loss).
        """
        weight = self.row_weights(batch)
        rows = (weight.view(len(weight), -1).sum(1) > 0).nonzero().squeeze(1)
        self.updates += 1
        if rows.numel() == 0:  # nothing to imitate: no step (Adam's momentum would move the weights)
            return {**self._last, "imitated_rows": torch.zeros((), device=self.device)}
        obs = {key: value[rows] for key, value in batch["obs"].items()}
        weight = weight[rows]
        if self.chunked:
            return self._chunk_step(obs, self.actor.normalize(batch["action_chunk"][rows]), weight)
        target = self.actor.normalize(batch["action"][rows])
        mean, log_std = self.actor.distribution(obs)
        pre_tanh_target = torch.atanh(target.clamp(-TARGET_EDGE, TARGET_EDGE))
        nll = -Normal(mean, log_std.exp(), validate_args=False).log_prob(pre_tanh_target).sum(-1)
        mse = (torch.tanh(mean) - target).pow(2).sum(-1)
        total = weight.sum()
        action_nll, action_mse = (weight * nll).sum() / total, (weight * mse).sum() / total
        loss = action_nll + action_mse
        step(self.actor_optim, loss)
        self._last = {"bc_loss": loss.detach(), "action_nll": action_nll.detach(), "action_mse": action_mse.detach()}
        return {**self._last, "imitated_rows": torch.tensor(float(rows.numel()), device=self.device)}

    def _chunk_step(self, obs: dict, chunks: torch.Tensor, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """The chunk policy's imitation loss towards the weighted actions of each row's chunk."""
        loss, parts = self.actor.imitation_loss(obs, chunks, weight)
        step(self.actor_optim, loss)
        self._last = {"bc_loss": loss.detach(), **parts}
        return {**self._last, "imitated_rows": torch.tensor(float(len(chunks)), device=self.device)}

    def state_dict(self) -> dict:
        return parts_state(self, ("actor", "actor_optim"))

    def load_state_dict(self, state: dict) -> None:
        load_parts_state(self, state, ("actor", "actor_optim"))
