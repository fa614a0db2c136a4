"""The VLA policy: named sizes with asserted parameter counts, the instruction as model input, and a
pretrained backbone loaded from a local safetensors file and kept frozen while the head trains."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from user_rl.algos import BCSettings, BehaviourCloning, metrics_to_floats
from user_rl.hal.instruction import decode_instruction, encode_instruction
from user_rl.policies import make_actor
from user_rl.policies.vla import SIZES, VLAChunkActor
from user_rl.policies.weights import load_weights, save_weights

OBS_SPACE = gym.spaces.Dict(
    {
        "image": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
        "instruction": gym.spaces.Box(0, 255, (16,), np.uint8),
        "state": gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
    }
)
ACTION_SPACE = gym.spaces.Box(-1, 1, (2,), np.float32)
H = 3
WORDS = {"go left": -0.8, "go right": 0.8}  # the instruction alone decides the action


def parameters(size: str) -> int:
    with torch.device("meta"):  # counted without allocating half a billion floats
        actor = VLAChunkActor(OBS_SPACE, ACTION_SPACE, chunk=H, size=size)
    return sum(p.numel() for p in actor.parameters())


def test_named_sizes_have_the_parameter_counts_they_are_named_for() -> None:
    counts = {size: parameters(size) for size in SIZES}
    print({size: f"{count / 1e6:.1f}M" for size, count in counts.items()})
    assert counts["tiny"] < 1_000_000
    assert 90e6 <= counts["100m"] <= 110e6
    assert 450e6 <= counts["500m"] <= 550e6
    with pytest.raises(ValueError, match="unknown VLA size 'huge'; named sizes: tiny, 100m, 500m"):
        VLAChunkActor(OBS_SPACE, ACTION_SPACE, size="huge")


def batch_for(rng: np.random.Generator, size: int = 128) -> dict:
    said = rng.choice(list(WORDS), size)
    chunk = np.repeat(np.array([WORDS[w] for w in said], np.float32)[:, None, None], H, 1).repeat(2, 2)
    obs = {
        "image": torch.from_numpy(rng.integers(0, 256, (size, 16, 16, 3), dtype=np.uint8)),
        "instruction": torch.from_numpy(np.stack([encode_instruction(w, 16) for w in said])),
        "state": torch.from_numpy(rng.normal(size=(size, 4)).astype(np.float32)),
    }
    return {
        "obs": obs,
        "action": torch.from_numpy(chunk[:, 0]),
        "action_chunk": torch.from_numpy(chunk),
        "intervened": torch.ones(size),
        "policy_acted": torch.zeros(size),
        "chunk_intervened": torch.ones(size, H),
        "chunk_policy_acted": torch.zeros(size, H),
    }


def act_on(actor, words: str, rng: np.random.Generator) -> np.ndarray:
    obs = batch_for(rng, 32)["obs"]
    obs["instruction"] = torch.from_numpy(np.stack([encode_instruction(words, 16)] * 32))
    return actor.act_chunk(obs, deterministic=True).numpy()


def test_the_instruction_reaches_the_policy_and_decides_its_actions() -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    algo = BehaviourCloning(
        OBS_SPACE, ACTION_SPACE, "vla", {"chunk": H, "flow_steps": 4, "size": "tiny"}, BCSettings(actor_lr=1e-3)
    )
    for _ in range(300):
        algo.update(batch_for(rng))
    left, right = act_on(algo.actor, "go left", rng), act_on(algo.actor, "go right", rng)
    print(f"mean action: 'go left' {left.mean():.2f}, 'go right' {right.mean():.2f}")
    assert np.abs(left - WORDS["go left"]).mean() < 0.15 and np.abs(right - WORDS["go right"]).mean() < 0.15
    with pytest.raises(ValueError, match="must fit in 16 bytes"):
        encode_instruction("x" * 17, 16)
    assert decode_instruction(encode_instruction("go left", 16)) == "go left"


def test_a_frozen_backbone_from_a_safetensors_file_stays_as_loaded_while_the_head_learns(tmp_path: Path) -> None:
    torch.manual_seed(1)
    pretrained = make_actor("vla", OBS_SPACE, ACTION_SPACE, chunk=H, size="tiny")
    save_weights(pretrained.encoder, tmp_path / "backbone.safetensors")  # names relative to the backbone
    backbone = {f"encoder.{name}": t for name, t in pretrained.encoder.state_dict().items()}
    from safetensors.torch import save_file

    save_file(backbone, str(tmp_path / "vla_backbone.safetensors"))  # as the actor names them

    torch.manual_seed(2)
    algo = BehaviourCloning(
        OBS_SPACE,
        ACTION_SPACE,
        "vla",
        {"chunk": H, "flow_steps": 4, "size": "tiny", "freeze": ["encoder"]},
        BCSettings(actor_lr=1e-3),
    )
    fresh = load_weights(algo.actor, tmp_path / "vla_backbone.safetensors")
    assert fresh and all(name.startswith("velocity_net.") for name in fresh)  # only the head starts fresh
    head_before = {n: t.clone() for n, t in algo.actor.state_dict().items() if n.startswith("velocity_net.")}
    stepped = sum(p.numel() for group in algo.actor_optim.param_groups for p in group["params"])
    head = sum(p.numel() for n, p in algo.actor.named_parameters() if n.startswith("velocity_net."))
    assert stepped == head < sum(p.numel() for p in algo.actor.parameters())
    rng = np.random.default_rng(3)
    for _ in range(20):
        metrics = metrics_to_floats(algo.update(batch_for(rng)))
    assert np.isfinite(metrics["bc_loss"])
    state = algo.actor.state_dict()
    for name, tensor in backbone.items():
        assert torch.equal(state[name], tensor), f"{name} moved although frozen"
    assert all(not torch.equal(state[n], t) for n, t in head_before.items() if n.endswith("weight"))
    with pytest.raises(ValueError, match="holds 'byte_embed.weight', which this policy does not have"):
        load_weights(algo.actor, tmp_path / "backbone.safetensors")  # names without the actor's prefix
    with pytest.raises(ValueError, match=r"freeze: no parameter is named 'backbone' or backbone\.\*"):
        make_actor("vla", OBS_SPACE, ACTION_SPACE, chunk=H, freeze=["backbone"])
