"""SAC's critic ensemble: targets from `target_critics` members drawn at random, the actor up the
ensemble's mean (RLPD) or the smaller of two (clipped double Q), settings checked up front, and a
checkpoint written when the twin critics were separate networks continuing exactly, Adam included."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from user_rl.algos import SAC, SACSettings, metrics_to_floats
from user_rl.algos.optim import adam
from user_rl.config import ConfigError, build_config
from user_rl.policies.encoders import DictEncoder, mlp

OBS = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (3,), np.float32)})
ACTION = gym.spaces.Box(-1, 1, (2,), np.float32)


def sac(**settings: object) -> SAC:
    return SAC(OBS, ACTION, policy_options={"hidden": [16, 16]}, settings=SACSettings(**settings))


def test_the_target_is_the_minimum_of_target_critics_members_drawn_at_random() -> None:
    qs = torch.arange(10.0).view(10, 1, 1).expand(10, 4, 1)  # member i values everything at i
    ten = sac(num_critics=10, target_critics=2)
    targets = {float(ten.target_q(qs)[0, 0]) for _ in range(300)}
    assert targets <= set(range(9)) and len(targets) >= 6  # the smaller of two distinct members, varying
    assert float(sac(num_critics=10, target_critics=10).target_q(qs)[0, 0]) == 0.0
    twin, pair = sac(), torch.tensor([[[1.0], [-2.0]], [[0.5], [3.0]]])
    rng = torch.get_rng_state()
    assert torch.equal(twin.target_q(pair), torch.tensor([[0.5], [-2.0]]))  # clipped double Q ...
    assert torch.equal(torch.get_rng_state(), rng)  # ... with nothing drawn


def test_the_actor_climbs_the_ensembles_mean_or_the_smaller_of_two() -> None:
    qs = torch.arange(10.0).view(10, 1, 1)
    assert float(sac(num_critics=10).actor_q(qs)) == 4.5
    assert float(sac().actor_q(qs[:2])) == 0.0


def test_more_target_critics_than_critics_is_refused_with_the_numbers() -> None:
    with pytest.raises(ConfigError, match=re.escape("config error: algo: algo.target_critics: at most num_critics")):
        build_config({"algo": {"type": "sac", "num_critics": 3, "target_critics": 5}})
    with pytest.raises(ValueError, match=re.escape("algo.target_critics: at most num_critics (1), not 2")):
        SAC(OBS, ACTION, policy_options={"hidden": [8]}, settings=SACSettings.model_construct(num_critics=1))
    assert build_config({"algo": {"type": "drq", "num_critics": 10}}).algo.target_critics == 2  # DrQ is SAC too


class SeparateTwinQCritic(nn.Module):
    """TwinQCritic as it was before the ensemble was stacked (the layout of older checkpoints)."""

    def __init__(self, hidden: list[int], layer_norm: bool) -> None:
        super().__init__()
        self.encoder = DictEncoder(OBS)
        self.q1 = mlp(3 + 2, hidden, 1, layer_norm)
        self.q2 = mlp(3 + 2, hidden, 1, layer_norm)

    def forward(self, obs: dict[str, torch.Tensor], action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.encoder(obs), action], -1)
        return torch.stack([self.q1(x), self.q2(x)])


def regress(critic: nn.Module, optimiser: torch.optim.Optimizer, seed: int) -> None:
    """One Adam step of both Q-networks towards random targets (the same for any layout)."""
    g = torch.Generator().manual_seed(seed)
    obs, action, target = (
        {"state": torch.rand(16, 3, generator=g)},
        torch.rand(16, 2, generator=g),
        torch.rand(16, 1, generator=g),
    )
    qs = critic(obs, action)
    loss = F.mse_loss(qs[0], target) + F.mse_loss(qs[1], target)
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()


@pytest.mark.parametrize("layer_norm", [False, True])
def test_a_checkpoint_of_separate_twin_critics_loads_and_continues_exactly(layer_norm: bool, tmp_path) -> None:
    torch.manual_seed(0)
    old, old_target = SeparateTwinQCritic([16, 16], layer_norm), SeparateTwinQCritic([16, 16], layer_norm)
    old_optim = adam(old.parameters(), 1e-2)  # as the older SAC built it
    for seed in range(3):
        regress(old, old_optim, seed)
    checkpoint = {
        **sac(critic_layer_norm=layer_norm).state_dict(),
        "critic": old.state_dict(),
        "critic_target": old_target.state_dict(),
        "critic_optim": old_optim.state_dict(),
    }
    torch.save(checkpoint, tmp_path / "checkpoint.pt")

    resumed = sac(critic_layer_norm=layer_norm)
    resumed.load_state_dict(torch.load(tmp_path / "checkpoint.pt", weights_only=True))
    obs, action = {"state": torch.rand(8, 3)}, torch.rand(8, 2)
    torch.testing.assert_close(resumed.critic(obs, action), old(obs, action))
    torch.testing.assert_close(resumed.critic_target(obs, action), old_target(obs, action))

    fresh = sac(critic_layer_norm=layer_norm)
    fresh.critic.load_state_dict(old.state_dict())  # the same weights, Adam from scratch
    for algo in (resumed, fresh):
        regress(algo.critic, algo.critic_optim, seed=3)
    regress(old, old_optim, seed=3)
    torch.testing.assert_close(resumed.critic(obs, action), old(obs, action))  # Adam's moments and step carried on
    assert not torch.allclose(fresh.critic(obs, action), old(obs, action), atol=1e-4)  # which matters
    batch = {"obs": obs, "next_obs": obs, "action": action, "reward": torch.rand(8), "terminated": torch.zeros(8)}
    assert np.isfinite(list(metrics_to_floats(resumed.update(batch)).values())).all()


def test_adam_state_of_separate_critics_that_stepped_apart_is_refused_clearly() -> None:
    old = SeparateTwinQCritic([16, 16], False)
    optimiser = adam(old.parameters(), 1e-3)
    regress(old, optimiser, seed=0)
    state = optimiser.state_dict()
    state["state"][len(state["state"]) - 1]["step"] += 1  # q2's last bias stepped once more
    resumed = sac()
    with pytest.raises(ValueError, match="Adam's state for separate Q-networks .* took different numbers of steps"):
        resumed.critic_optim.load_state_dict(state)
