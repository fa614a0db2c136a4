"""DrQ's parts: the random shift, one camera encoder trained by the critic only, and an actor an
edge runs as a plain actor."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from user_rl.algos import DrQSettings, make_algo
from user_rl.algos.augment import random_shift
from user_rl.policies import make_actor

OBS_SPACE = gym.spaces.Dict(
    {"image": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8), "state": gym.spaces.Box(-1, 1, (4,), np.float32)}
)
ACTION_SPACE = gym.spaces.Box(-2, 2, (3,), np.float32)


def batch(rng: np.random.Generator, size: int = 8) -> dict:
    def obs() -> dict[str, torch.Tensor]:
        return {
            "image": torch.from_numpy(rng.integers(0, 256, (size, 16, 16, 3), dtype=np.uint8)),
            "state": torch.from_numpy(rng.uniform(-1, 1, (size, 4)).astype(np.float32)),
        }

    return {
        "obs": obs(),
        "next_obs": obs(),
        "action": torch.from_numpy(rng.uniform(-2, 2, (size, 3)).astype(np.float32)),
        "reward": torch.from_numpy(rng.normal(size=size).astype(np.float32)),
        "terminated": torch.zeros(size, dtype=torch.bool),
    }


def test_random_shift_moves_each_image_by_at_most_pad_pixels_and_repeats_its_edges() -> None:
    torch.manual_seed(0)
    images = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (64, 10, 12, 3), dtype=np.uint8))
    shifted = random_shift(images, 2)
    assert shifted.dtype == torch.uint8 and shifted.shape == images.shape
    padded = np.pad(images.numpy(), ((0, 0), (2, 2), (2, 2), (0, 0)), mode="edge")
    offsets = set()
    for i in range(len(images)):  # each is one of the 25 crops of the edge-padded image
        crops = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if np.array_equal(padded[i, dy : dy + 10, dx : dx + 12], shifted[i].numpy())
        ]
        assert crops, f"image {i} is not a shifted crop"
        offsets.add(crops[0])
    assert len(offsets) > 10  # shifts differ from image to image
    assert torch.equal(random_shift(images, 0), images)


def test_the_encoder_is_the_critics_and_the_actor_loss_leaves_it_alone() -> None:
    torch.manual_seed(0)
    drq = make_algo(
        "drq",
        OBS_SPACE,
        ACTION_SPACE,
        policy_options={"hidden": [32]},
        settings=DrQSettings.model_construct(critic_lr=0.0),
    )  # only the actor's loss may move anything (a learning rate the config refuses: built unchecked)
    assert drq.actor.encoder is drq.critic.encoder and drq.critic_target.encoder is not drq.critic.encoder
    encoder = {k: v.clone() for k, v in drq.critic.encoder.state_dict().items()}
    head = {k: v.clone() for k, v in drq.actor.trunk.state_dict().items()}
    drq.update(batch(np.random.default_rng(0)))
    for key, value in drq.critic.encoder.state_dict().items():
        assert torch.equal(value, encoder[key]), key
    assert any(not torch.equal(v, head[k]) for k, v in drq.actor.trunk.state_dict().items())


def test_the_critic_loss_trains_the_encoder_and_the_edge_runs_the_published_actor() -> None:
    torch.manual_seed(0)
    drq = make_algo("drq", OBS_SPACE, ACTION_SPACE, policy_options={"hidden": [32]})
    before = {k: v.clone() for k, v in drq.critic.encoder.state_dict().items()}
    rng = np.random.default_rng(1)
    for _ in range(3):
        drq.update(batch(rng))
    assert any(not torch.equal(v, before[k]) for k, v in drq.critic.encoder.state_dict().items())
    # What the learner publishes loads into the actor an edge builds, and acts the same.
    edge_actor = make_actor("mlp", OBS_SPACE, ACTION_SPACE, hidden=[32])
    edge_actor.load_state_dict(drq.actor.state_dict())
    obs = batch(rng)["obs"]
    expected = drq.actor.act(obs, deterministic=True)
    assert torch.equal(edge_actor.act(obs, deterministic=True), expected)
    assert float(expected.abs().max()) <= 2.0  # in the robot's units


def test_drq_needs_camera_observations() -> None:
    state_only = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (4,), np.float32)})
    with pytest.raises(
        ValueError,
        match=r"drq learns from camera images, and this robot's observations have none "
        r"\(state\): use algo.type sac",
    ):
        make_algo("drq", state_only, ACTION_SPACE)
