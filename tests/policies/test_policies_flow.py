"""The flow chunk policy, the chunk runner edges and evaluations use, and local weight files."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from user_rl.algos import BCSettings, BehaviourCloning, QChunking, metrics_to_floats
from user_rl.policies import ChunkRunner, FlowChunkActor, make_actor
from user_rl.policies.weights import load_weights, save_weights

OBS_SPACE = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (3,), np.float32)})
ACTION_SPACE = gym.spaces.Box(-2, 2, (2,), np.float32)  # non-unit bounds: the scaling is exercised
H = 4


def expert_chunk(state: np.ndarray) -> np.ndarray:
    """A chunk that depends on the state and changes along the chunk: (B, H, 2) within the bounds."""
    ramp = np.linspace(0.5, 1.0, H, dtype=np.float32)[None, :, None]
    return np.clip(np.stack([state[:, 0] + state[:, 1], state[:, 2] - state[:, 0]], -1)[:, None, :] * ramp, -2, 2)


def chunk_batch(rng: np.random.Generator, size: int = 256, demonstrated_until: np.ndarray | None = None) -> dict:
    """Rows whose chunks the expert executed (chunk_intervened 1 up to `demonstrated_until` actions)."""
    state = rng.uniform(-1, 1, (size, 3)).astype(np.float32)
    chunk = expert_chunk(state)
    until = np.full(size, H) if demonstrated_until is None else demonstrated_until
    demonstrated = (np.arange(H)[None] < until[:, None]).astype(np.float32)
    chunk = np.where(demonstrated[..., None] > 0, chunk, rng.uniform(-2, 2, chunk.shape).astype(np.float32))
    return {
        "obs": {"state": torch.from_numpy(state)},
        "action": torch.from_numpy(chunk[:, 0]),
        "action_chunk": torch.from_numpy(chunk),
        "intervened": torch.from_numpy(demonstrated[:, 0]),
        "policy_acted": torch.zeros(size),
        "chunk_intervened": torch.from_numpy(demonstrated),
        "chunk_policy_acted": torch.zeros(size, H),
    }


def test_flow_policy_outputs_chunks_in_the_robots_units() -> None:
    actor = make_actor("flow", OBS_SPACE, ACTION_SPACE, hidden=[32], chunk=H, flow_steps=3)
    obs = {"state": torch.zeros(5, 3)}
    chunk = actor.act_chunk(obs)
    assert chunk.shape == (5, H, 2) and actor.chunk_length == H
    assert (chunk.abs() <= 2.0).all()
    assert torch.equal(actor.act_chunk(obs, deterministic=True), actor.act_chunk(obs, deterministic=True))
    assert actor.act(obs).shape == (5, 2)
    with pytest.raises(ValueError, match="chunk, flow_steps and best_of must be >= 1"):
        make_actor("flow", OBS_SPACE, ACTION_SPACE, hidden=[32], chunk=0)


def test_behaviour_cloning_teaches_a_flow_policy_whole_chunks_and_only_what_was_demonstrated() -> None:
    """Half the rows' chunks were cut short by a hand-back (after 1 or 2 actions: the rest is junk the
    policy did): flow matching on the demonstrated actions only still learns every action of the chunk."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    algo = BehaviourCloning(
        OBS_SPACE, ACTION_SPACE, "flow", {"hidden": [128, 128], "chunk": H, "flow_steps": 10}, BCSettings(actor_lr=1e-3)
    )
    for _ in range(1500):
        until = np.where(rng.random(256) < 0.5, H, rng.integers(1, 3, 256))
        metrics = metrics_to_floats(algo.update(chunk_batch(rng, demonstrated_until=until)))
    assert metrics["imitated_rows"] == 256
    test = rng.uniform(-1, 1, (300, 3)).astype(np.float32)
    got = algo.actor.act_chunk({"state": torch.from_numpy(test)}, deterministic=True).numpy()
    error = np.abs(got - expert_chunk(test))
    print(f"flow BC: mean error {error.mean():.3f}, per chunk position {error.mean((0, 2)).round(3)}")
    assert error.mean() < 0.1, error.mean((0, 2))
    assert error[:, -1].mean() < 0.12  # the last action was demonstrated in only half the rows


def test_q_chunking_values_chunks_by_their_reward_and_picks_the_best() -> None:
    """One-step episodes (each chunk ends the episode): reward 1 for a chunk near the expert's, else 0.
    The critic learns the difference and best-of-N picks chunks nearer the expert than the flow's average."""
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    algo = QChunking(
        OBS_SPACE, ACTION_SPACE, "flow", {"hidden": [128, 128], "chunk": H, "flow_steps": 4, "best_of": 16}
    )
    for _ in range(1500):
        state = rng.uniform(-1, 1, (256, 3)).astype(np.float32)
        chunk = np.clip(expert_chunk(state) + rng.normal(0, 1.0, (256, H, 2)).astype(np.float32), -2, 2)
        close = np.abs(chunk - expert_chunk(state)).mean((1, 2)) < 0.5
        batch = {
            "obs": {"state": torch.from_numpy(state)},
            "next_obs": {"state": torch.from_numpy(state)},
            "reward": torch.from_numpy(close.astype(np.float32)),
            "terminated": torch.ones(256, dtype=torch.bool),
            "discount": torch.full((256,), 0.99**H),
            "action_chunk": torch.from_numpy(chunk),
            "chunk_intervened": torch.ones(256, H),
            "chunk_policy_acted": torch.zeros(256, H),
        }
        metrics = metrics_to_floats(algo.update(batch))
    assert set(metrics) == {"critic_loss", "flow_loss", "q"}
    test = {"state": torch.from_numpy(rng.uniform(-1, 1, (300, 3)).astype(np.float32))}
    best = algo.actor.act_chunk(test).numpy()
    plain = (algo.actor.sample_from(algo.actor.encoder(test)) * 2.0).detach().numpy()
    target = expert_chunk(test["state"].numpy())
    best_near = (np.abs(best - target).mean((1, 2)) < 0.5).mean()
    plain_near = (np.abs(plain - target).mean((1, 2)) < 0.5).mean()
    print(f"chunks near the expert's: best of 16 {best_near:.2f}, one sample {plain_near:.2f}")
    assert best_near > plain_near + 0.15


def test_chunk_runner_infers_once_per_chunk_and_restarts_on_request() -> None:
    actor = make_actor("flow", OBS_SPACE, ACTION_SPACE, hidden=[16], chunk=H, flow_steps=2)
    runner = ChunkRunner(actor)
    obs = {"state": np.zeros(3, np.float32)}
    steps = [runner(obs)[1] for _ in range(10)]
    assert steps == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1] and runner.inferences == 3
    runner.restart()
    assert runner(obs)[1] == 0 and runner.inferences == 4
    mlp = ChunkRunner(make_actor("mlp", OBS_SPACE, ACTION_SPACE, hidden=[16]))  # no chunks: H = 1
    assert [mlp(obs)[1] for _ in range(3)] == [0, 0, 0] and mlp.inferences == 3


def test_local_weights_load_by_name_and_a_partial_file_leaves_the_rest_fresh(tmp_path: Path) -> None:
    cloned = make_actor("flow", OBS_SPACE, ACTION_SPACE, hidden=[16], chunk=H)
    save_weights(cloned, tmp_path / "bc.safetensors")
    with_critic = make_actor("flow", OBS_SPACE, ACTION_SPACE, hidden=[16], chunk=H, best_of=4)
    fresh = load_weights(with_critic, tmp_path / "bc.safetensors")
    assert fresh and all(name.startswith("value.") for name in fresh)  # Q-chunking's critic starts fresh
    for name, tensor in cloned.state_dict().items():
        assert torch.equal(with_critic.state_dict()[name], tensor), name
    torch.save({"actor": cloned.state_dict(), "policy_version": 3}, tmp_path / "checkpoint.pt")
    assert (
        load_weights(make_actor("flow", OBS_SPACE, ACTION_SPACE, hidden=[16], chunk=H), tmp_path / "checkpoint.pt")
        == []
    )
    with pytest.raises(ValueError, match="has shape"):
        load_weights(make_actor("flow", OBS_SPACE, ACTION_SPACE, hidden=[16], chunk=H + 1), tmp_path / "bc.safetensors")
    with pytest.raises(ValueError, match="which this policy does not have"):
        load_weights(make_actor("mlp", OBS_SPACE, ACTION_SPACE, hidden=[16]), tmp_path / "bc.safetensors")
    with pytest.raises(FileNotFoundError, match="no weights file"):
        load_weights(cloned, tmp_path / "missing.safetensors")


def test_flow_policy_runs_from_pixels() -> None:
    space = gym.spaces.Dict(
        {"image": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8), "state": gym.spaces.Box(-1, 1, (3,), np.float32)}
    )
    actor = FlowChunkActor(space, ACTION_SPACE, hidden=[16], chunk=2, flow_steps=2, best_of=3)
    obs = {"image": torch.zeros(2, 16, 16, 3, dtype=torch.uint8), "state": torch.zeros(2, 3)}
    assert actor.act_chunk(obs).shape == (2, 2, 2)


def test_an_instructions_bytes_reach_an_mlp_policy_scaled_like_pixels() -> None:
    """Raw byte values (up to 255) beside a state near 1 swamped the first layer: a flow policy did not
    learn the two-colour reach from its state until the bytes were scaled to [0, 1]."""
    from user_rl.hal.instruction import encode_instruction, instruction_space
    from user_rl.policies.encoders import DictEncoder

    space = gym.spaces.Dict({"instruction": instruction_space(8), "state": gym.spaces.Box(-1, 1, (2,), np.float32)})
    encoder = DictEncoder(space)
    text = torch.as_tensor(encode_instruction("red", 8)).unsqueeze(0)
    features = encoder({"instruction": text, "state": torch.full((1, 2), 0.5)})
    assert encoder.out_dim == 10
    assert torch.allclose(features[0, :8], text[0].float() / 255.0) and 0 < features[0, :3].min()
    assert torch.equal(features[0, 8:], torch.full((2,), 0.5))
