"""SAC learns a one-step task whose best action depends on the observation (also with the RLPD
recipe's LayerNorm critics, and with its ensemble of ten critics), and its critics regress on the
right bootstrapped target for terminated, truncated and n-step rows."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from user_rl.algos import SAC, SACSettings, metrics_to_floats
from user_rl.policies.ensemble import StackedLayerNorm, StackedLinear


def train_on_bandit(**settings: object) -> SAC:
    """SAC after 600 updates on a one-step task whose reward peaks at action = 1.5 * state[0]."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    obs_space = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (2,), np.float32)})
    action_space = gym.spaces.Box(-2, 2, (1,), np.float32)  # non-unit bounds: scaling is exercised
    sac = SAC(
        obs_space,
        action_space,
        policy_options={"hidden": [64, 64]},
        settings=SACSettings.model_construct(  # a bandit: gamma 0, which a run's config refuses (built unchecked)
            gamma=0.0, actor_lr=3e-3, critic_lr=3e-3, init_alpha=0.01, **settings
        ),
    )
    for _ in range(600):
        state = torch.as_tensor(rng.uniform(-1, 1, (128, 2)), dtype=torch.float32)
        action = torch.as_tensor(rng.uniform(-2, 2, (128, 1)), dtype=torch.float32)
        best = state[:, :1] * 1.5  # the reward peaks at action = 1.5 * state[0]
        reward = -((action - best) ** 2).squeeze(-1)
        sac.update(
            {
                "obs": {"state": state},
                "next_obs": {"state": state},
                "action": action,
                "reward": reward,
                "terminated": torch.ones(128),
            }
        )
    return sac


def assert_solves_bandit(sac: SAC) -> None:
    test = torch.as_tensor([[-0.8, 0.0], [0.0, 0.5], [0.8, -0.5]], dtype=torch.float32)
    chosen = sac.actor.act({"state": test}, deterministic=True)
    print(f"chosen {chosen.squeeze(-1).tolist()}, best {(test[:, 0] * 1.5).tolist()}")
    assert torch.allclose(chosen, test[:, :1] * 1.5, atol=0.25), chosen


def test_sac_learns_an_observation_dependent_bandit() -> None:
    sac = train_on_bandit()
    assert not any(isinstance(m, nn.LayerNorm) for m in sac.critic.modules())  # the default is unchanged
    assert_solves_bandit(sac)


def test_sac_with_layer_norm_critics_rlpd_learns_the_same_bandit() -> None:
    sac = train_on_bandit(critic_layer_norm=True)
    for critic in (sac.critic, sac.critic_target):  # one LayerNorm per hidden layer, before its ReLU
        kinds = [type(m) for m in critic.qs]
        linear, norm = StackedLinear, StackedLayerNorm
        assert kinds == [linear, norm, nn.ReLU, linear, norm, nn.ReLU, linear], kinds
        assert critic.qs[1].weight.shape == (2, 1, 64)  # each of the two critics with its own scale
    # the actor (what edges load) is the same network either way
    assert not any(isinstance(m, nn.LayerNorm) for m in sac.actor.modules())
    assert_solves_bandit(sac)


def test_sac_with_an_ensemble_of_ten_critics_rlpd_learns_the_same_bandit() -> None:
    """RLPD's ensemble: ten critics, each target the minimum of two drawn at random, the actor up their mean."""
    sac = train_on_bandit(num_critics=10, target_critics=2)
    features = sac.critic.encoder({"state": torch.zeros(5, 2)})
    assert sac.critic.q_of(features, torch.zeros(5, 1)).shape == (10, 5, 1)
    assert_solves_bandit(sac)


def test_sac_state_dict_round_trip_and_image_observations() -> None:
    obs_space = gym.spaces.Dict(
        {
            "image": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8),
            "state": gym.spaces.Box(-1, 1, (4,), np.float32),
        }
    )
    action_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    sac = SAC(obs_space, action_space, policy_options={"hidden": [32]})
    obs = {"image": torch.randint(0, 256, (8, 32, 32, 3), dtype=torch.uint8), "state": torch.rand(8, 4)}
    batch = {
        "obs": obs,
        "next_obs": obs,
        "action": torch.rand(8, 3),
        "reward": torch.rand(8),
        "terminated": torch.zeros(8),
    }
    metrics = metrics_to_floats(sac.update(batch))
    assert set(metrics) == {"critic_loss", "actor_loss", "alpha", "q"} and np.isfinite(list(metrics.values())).all()
    clone = SAC(obs_space, action_space, policy_options={"hidden": [32]})
    clone.load_state_dict(sac.state_dict())
    assert clone.updates == 1
    a = sac.actor.act(obs, deterministic=True)
    assert torch.equal(a, clone.actor.act(obs, deterministic=True))
    assert a.shape == (8, 3) and (a.abs() <= 1).all()


def test_td_target_bootstraps_truncated_and_n_step_rows_and_not_terminated_ones() -> None:
    """Four rows, computed by hand from the networks' own outputs at the same sampled a':
    a terminated row (no bootstrap), a time-limit truncation (terminated = 0: bootstraps with
    gamma), an ordinary step, and an n-step row whose `discount` column is gamma ** 3."""
    torch.manual_seed(0)
    gamma = 0.9
    obs_space = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (3,), np.float32)})
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    sac = SAC(
        obs_space, action_space, policy_options={"hidden": [16]}, settings=SACSettings(gamma=gamma, init_alpha=0.3)
    )
    with torch.no_grad():  # target critics that differ from the online ones, as after training
        for p in sac.critic_target.parameters():
            p.add_(0.1 * torch.randn_like(p))
    obs, next_obs = {"state": torch.rand(4, 3) * 2 - 1}, {"state": torch.rand(4, 3) * 2 - 1}
    reward = torch.tensor([1.0, 2.0, -0.5, 0.25])
    terminated = torch.tensor([1.0, 0.0, 0.0, 0.0])  # row 0 ends for real; row 1 was truncated
    batch = {
        "obs": obs,
        "next_obs": next_obs,
        "action": torch.rand(4, 2) * 2 - 1,
        "reward": reward,
        "terminated": terminated,
    }

    torch.manual_seed(123)  # the same a' ~ pi(s') for the hand computation and for SAC
    with torch.no_grad():
        next_action, next_logp = sac.actor.sample(next_obs)
        q1_next, q2_next = sac.critic_target(next_obs, next_action)
        alpha = 0.3  # init_alpha: no update has changed it yet
        soft_v = [min(float(q1_next[i]), float(q2_next[i])) - alpha * float(next_logp[i]) for i in range(4)]
    by_hand = [
        1.0,  # terminated: the reward alone
        2.0 + gamma * soft_v[1],  # truncated: bootstraps
        -0.5 + gamma * soft_v[2],
    ]  # an ordinary step
    torch.manual_seed(123)
    target = sac.td_target(batch).squeeze(-1)
    assert torch.allclose(target[:3], torch.tensor(by_hand), atol=1e-5), (target, by_hand)
    assert torch.allclose(target[3], torch.tensor(0.25 + gamma * soft_v[3]), atol=1e-5)

    n_step = {**batch, "discount": torch.tensor([gamma, gamma, gamma**3, gamma**2])}
    torch.manual_seed(123)
    target = sac.td_target(n_step).squeeze(-1)
    expected = torch.tensor([1.0, 2.0 + gamma * soft_v[1], -0.5 + gamma**3 * soft_v[2], 0.25 + gamma**2 * soft_v[3]])
    assert torch.allclose(target, expected, atol=1e-5), (target, expected)

    # And `update` regresses both critics on exactly that target.
    with torch.no_grad():
        q1, q2 = sac.critic(obs, sac.actor.normalize(batch["action"]))
        loss_by_hand = F.mse_loss(q1.squeeze(-1), expected) + F.mse_loss(q2.squeeze(-1), expected)
    torch.manual_seed(123)
    metrics = metrics_to_floats(sac.update(n_step))
    print(
        f"td targets {expected.tolist()}, critic loss {metrics['critic_loss']:.6f} (by hand {float(loss_by_hand):.6f})"
    )
    assert abs(metrics["critic_loss"] - float(loss_by_hand)) < 1e-5


def test_the_actor_step_moves_the_actor_only_and_leaves_each_parameter_trainable_as_it_was() -> None:
    """`frozen` keeps the critic's weights out of the actor's backward pass (their gradients would be thrown
    away), and afterwards every parameter takes gradients again exactly as before: a frozen one stays frozen."""
    from user_rl.algos.base import frozen

    space = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (4,), np.float32)})
    sac = SAC(space, gym.spaces.Box(-1, 1, (2,), np.float32), "mlp", {"hidden": [16]})
    kept_frozen = next(sac.critic.parameters()).requires_grad_(False)
    obs = {"state": torch.randn(8, 4)}
    with frozen(sac.critic):
        action, _ = sac.actor.sample(obs)
        sac.critic(obs, action).sum().backward()
    assert all(p.grad is None for p in sac.critic.parameters()), "the critic took gradients from the actor's loss"
    assert all(p.grad is not None for p in sac.actor.parameters() if p.requires_grad)
    assert not kept_frozen.requires_grad
    assert all(p.requires_grad for p in sac.critic.parameters() if p is not kept_frozen)
