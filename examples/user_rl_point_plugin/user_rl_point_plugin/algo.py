"""ALGORITHM: REDQ, randomized ensembled double Q-learning (Chen et al., 2021).

SAC with an ensemble of N critics instead of two: each update's target takes the minimum over M of
them drawn at random, and the actor maximises their mean. With many updates per env step
(`algo.utd_ratio`) it learns from few steps. User-rl's SAC has the ensemble (`algo.num_critics`,
`algo.target_critics`), so REDQ is SAC with ten critics by default and one method replaced: its
actor climbs the ensemble's mean whatever its size, where SAC's climbs the smaller of two. The rest
is SAC's, inherited: the ensemble and its targets, the temperature, the target networks, n-step
discounts, checkpoints.
"""

from __future__ import annotations

import torch
from pydantic import Field

from user_rl.algos import SAC, SACSettings


class REDQSettings(SACSettings):
    """The config's `algo` keys for redq: SAC's (gamma, tau, actor_lr, target_critics, ...), ten critics by default."""

    num_critics: int = Field(10, ge=1, le=100, description="N: the ensemble's critics")


class REDQ(SAC):
    name = "redq"
    Settings = REDQSettings

    def actor_q(self, qs: torch.Tensor) -> torch.Tensor:
        """The mean of every critic's value ([N, B, 1]: one row of Q-values per critic)."""
        return qs.mean(dim=0)
