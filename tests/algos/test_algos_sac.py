"""SAC learns: a one-step task whose best action depends on the observation."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from user_rl.algos import SAC, SACSettings


def test_sac_learns_an_observation_dependent_bandit() -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    obs_space = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (2,), np.float32)})
    action_space = gym.spaces.Box(-2, 2, (1,), np.float32)  # non-unit bounds: scaling is exercised
    sac = SAC(obs_space, action_space, policy_options={"hidden": [64, 64]},
              settings=SACSettings(gamma=0.0, actor_lr=3e-3, critic_lr=3e-3, init_alpha=0.01))
    for _ in range(600):
        state = torch.as_tensor(rng.uniform(-1, 1, (128, 2)), dtype=torch.float32)
        action = torch.as_tensor(rng.uniform(-2, 2, (128, 1)), dtype=torch.float32)
        best = state[:, :1] * 1.5  # the reward peaks at action = 1.5 * state[0]
        reward = -((action - best) ** 2).squeeze(-1)
        sac.update({"obs": {"state": state}, "next_obs": {"state": state}, "action": action,
                    "reward": reward, "terminated": torch.ones(128)})
    test = torch.as_tensor([[-0.8, 0.0], [0.0, 0.5], [0.8, -0.5]], dtype=torch.float32)
    chosen = sac.actor.act({"state": test}, deterministic=True)
    assert torch.allclose(chosen, test[:, :1] * 1.5, atol=0.25), chosen


def test_sac_state_dict_round_trip_and_image_observations() -> None:
    obs_space = gym.spaces.Dict({
        "image": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8),
        "state": gym.spaces.Box(-1, 1, (4,), np.float32),
    })
    action_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    sac = SAC(obs_space, action_space, policy_options={"hidden": [32]})
    obs = {"image": torch.randint(0, 256, (8, 32, 32, 3), dtype=torch.uint8), "state": torch.rand(8, 4)}
    batch = {"obs": obs, "next_obs": obs, "action": torch.rand(8, 3), "reward": torch.rand(8),
             "terminated": torch.zeros(8)}
    metrics = sac.update(batch)
    assert np.isfinite(list(metrics.values())).all()
    clone = SAC(obs_space, action_space, policy_options={"hidden": [32]})
    clone.load_state_dict(sac.state_dict())
    assert clone.updates == 1
    a = sac.actor.act(obs, deterministic=True)
    assert torch.equal(a, clone.actor.act(obs, deterministic=True))
    assert a.shape == (8, 3) and (a.abs() <= 1).all()
