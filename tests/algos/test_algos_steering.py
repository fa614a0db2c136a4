"""DSRL and residual RL steer a frozen chunk policy: the base's weights never change, only the small
actor is trained and published, the executed chunk follows the small actor, and both learn a
contextual chunk bandit the base alone does badly on."""

from __future__ import annotations

import hashlib

import gymnasium as gym
import numpy as np
import pytest
import torch

from user_rl.algos import DSRLSettings, ResidualSettings, make_algo
from user_rl.cloud.actor_buffers import ActorBuffers

OBS_SPACE = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (2,), np.float32)})
ACTION_SPACE = gym.spaces.Box(-2, 2, (2,), np.float32)
CHUNK = 3
FLOW = {"hidden": [64, 64], "chunk": CHUNK, "flow_steps": 4}
SETTINGS = {
    "dsrl": DSRLSettings(steer_hidden=[64, 64], critic_hidden=[64, 64], actor_lr=1e-3, critic_lr=1e-3),
    "residual": ResidualSettings(
        steer_hidden=[64, 64], critic_hidden=[64, 64], actor_lr=1e-3, critic_lr=1e-3, scale=1.0
    ),
}


def build(name: str, seed: int = 0, **settings):
    """`name` on the flow base with the test's settings, changed by `settings`."""
    torch.manual_seed(seed)
    return make_algo(name, OBS_SPACE, ACTION_SPACE, "flow", FLOW, SETTINGS[name].model_copy(update=settings))


def digest(module: torch.nn.Module) -> str:
    return hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in module.state_dict().values())).hexdigest()


def bandit_target(state: torch.Tensor) -> torch.Tensor:
    """The best chunk for a state: every action at (state[0], -state[1]), in normalised units."""
    return torch.stack([state[:, 0], -state[:, 1]], dim=-1).unsqueeze(1).expand(-1, CHUNK, -1)


def bandit_batch(algo, size: int = 128) -> dict:
    """One-step episodes: the robot executed the steered chunk; reward is minus its distance to the target."""
    state = torch.rand(size, 2) * 2 - 1
    obs = {"state": state}
    with torch.no_grad():
        chunk = algo.actor.act_chunk(obs)  # robot units, as the edge records them
    reward = -(algo.actor.normalize(chunk) - bandit_target(state)).abs().mean(dim=(1, 2))
    return {
        "obs": obs,
        "next_obs": {"state": torch.rand(size, 2) * 2 - 1},
        "action_chunk": chunk,
        "reward": reward,
        "terminated": torch.ones(size, dtype=torch.bool),
        "discount": torch.full((size,), 0.99**CHUNK),
    }


def assert_it_learns_the_bandit(algo, label: str, updates: int = 400) -> None:
    """`updates` on the algorithm's own chunks lift the steered return well above the base's, which stays as it was."""
    base_before, base_return = digest(algo.pretrained), bandit_return(algo.pretrained)
    for _ in range(updates):
        algo.update(bandit_batch(algo))
    steered = bandit_return(algo.actor)
    print(f"{label}: base {base_return:.3f}, steered {steered:.3f}")
    assert steered > base_return + 0.1 and digest(algo.pretrained) == base_before


def bandit_return(actor, episodes: int = 512) -> float:
    torch.manual_seed(123)
    state = torch.rand(episodes, 2) * 2 - 1
    chunk = actor.normalize(actor.act_chunk({"state": state}, deterministic=True))
    return float(-(chunk - bandit_target(state)).abs().mean())


@pytest.mark.parametrize("name", ["dsrl", "residual"])
def test_only_the_small_actor_trains_and_travels_and_the_base_never_changes(name: str) -> None:
    algo = build(name)
    base_before = digest(algo.pretrained)
    trainable = {n for n, p in algo.actor.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("steer.") for n in trainable)
    for _ in range(20):
        algo.update(bandit_batch(algo))
    assert digest(algo.pretrained) == base_before
    # A published version carries the small actor; the base goes once, as the frozen base part.
    buffers = ActorBuffers(algo.actor, count=1)
    own = {slot.name for slot in buffers.own_layout.slots}
    scaling = {"base.action_scale", "base.action_bias", "normalised_low", "normalised_high"}  # bounds, no weights
    assert {n for n in own if not n.startswith("steer.")} <= scaling
    steer_bytes = sum(p.numel() * p.element_size() for p in algo.actor.steer.parameters())
    base_bytes = sum(p.numel() * p.element_size() for p in algo.pretrained.parameters())
    assert buffers.base_layout.total_bytes == base_bytes
    assert steer_bytes <= buffers.own_layout.total_bytes < steer_bytes + 1024  # + the action scaling


def test_dsrl_executes_the_chunk_the_base_integrates_from_the_chosen_noise() -> None:
    algo = build("dsrl")
    actor = algo.actor
    obs = {"state": torch.rand(4, 2) * 2 - 1}
    noise = torch.randn(4, CHUNK * 2)
    with torch.no_grad():
        first, again = actor.chunk_from_noise(obs, noise), actor.chunk_from_noise(obs, noise)
        other = actor.chunk_from_noise(obs, torch.randn(4, CHUNK * 2))
        latent = actor.steer.act(obs, deterministic=True)
        expected = actor.to_robot_units(actor.chunk_from_noise(obs, latent * actor.noise_bound))
    assert torch.equal(first, again) and not torch.allclose(first, other)  # the noise names the chunk
    assert latent.abs().max() <= 1.0
    assert torch.allclose(actor.act_chunk(obs, deterministic=True), expected)
    with torch.no_grad():  # another steering actor, another executed chunk, the same base
        actor.steer.trunk[-1].bias.add_(1.0)
    assert not torch.allclose(actor.act_chunk(obs, deterministic=True), expected)


def test_residual_corrects_the_base_chunk_by_at_most_its_scale() -> None:
    algo = build("residual")
    actor = algo.actor
    obs = {"state": torch.rand(64, 2) * 2 - 1}
    base_chunk = actor.base_chunk(obs)
    assert torch.equal(actor.chunk_from(obs, torch.zeros(64, CHUNK * 2)), base_chunk)  # within the bounds already
    corrected = actor.chunk_from(obs, torch.rand(64, CHUNK * 2) * 2 - 1)
    assert (corrected - base_chunk).abs().max() <= actor.scale + 1e-6
    assert (corrected - base_chunk).abs().max() > actor.scale / 2


@pytest.mark.parametrize("name", ["dsrl", "residual"])
def test_steering_learns_a_chunk_bandit_the_frozen_base_does_badly_on(name: str) -> None:
    assert_it_learns_the_bandit(build(name), name)


def test_dsrl_through_the_base_learns_the_bandit_without_a_noise_critic() -> None:
    """`through_base`: the actor climbs the chunk critic through the base's denoising (a small base)."""
    algo = build("dsrl", through_base=True)
    assert not hasattr(algo, "noise_critic") and "noise_critic" not in algo.state_dict()
    assert_it_learns_the_bandit(algo, "dsrl through the base")


@pytest.mark.parametrize("name", ["dsrl", "residual"])
def test_the_chunk_critic_learns_from_a_persons_chunks_the_small_actor_never_chose(name: str) -> None:
    """Rows where a person took over carry the chunk the person executed: the critic over executed
    chunks values them (above the base's own chunk), and the small actor moves towards them."""
    algo = build(name, seed=1)
    base_return = bandit_return(algo.pretrained)
    for _ in range(300):
        batch = bandit_batch(algo)
        person = slice(0, len(batch["reward"]) // 2)  # half the rows: the person's chunk, near the best one
        state = batch["obs"]["state"][person]
        taken_over = (bandit_target(state) + 0.05 * torch.randn_like(bandit_target(state))).clamp(-1, 1)
        batch["action_chunk"][person] = algo.actor.to_robot_units(taken_over)
        batch["reward"][person] = -(taken_over - bandit_target(state)).abs().mean(dim=(1, 2))
        algo.update(batch)
    state = torch.rand(256, 2) * 2 - 1
    with torch.no_grad():
        person_q = torch.min(*algo.critic({"state": state}, bandit_target(state).flatten(1)))
        base_q = torch.min(
            *algo.critic(
                {"state": state},
                algo.pretrained.normalize(algo.pretrained.act_chunk({"state": state}, deterministic=True)).flatten(1),
            )
        )
    assert (person_q > base_q).float().mean() >= 0.9
    steered = bandit_return(algo.actor)
    print(f"{name} with a person's chunks: base {base_return:.3f}, steered {steered:.3f}")
    assert steered > base_return + 0.1


def test_shared_noise_steers_one_row_repeated_over_the_chunk() -> None:
    algo = build("dsrl", shared_noise=True)
    actor = algo.actor
    assert actor.latent_dim == 2 and algo.actor.steer.trunk[-1].out_features == 2 * 2  # mean and log-std of one row
    obs = {"state": torch.rand(4, 2) * 2 - 1}
    row = torch.randn(4, 2)
    assert torch.equal(actor.chunk_from_noise(obs, row), actor.base.chunk_from_noise(obs, row.repeat(1, CHUNK)))
    assert_it_learns_the_bandit(algo, "dsrl, shared noise")
