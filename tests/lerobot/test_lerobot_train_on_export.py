"""LeRobot's own `lerobot-train` trains ACT and diffusion on our exports as they are written (issue 32,
point 1): with a camera, and state-only with observation keys not named `state`. The ACT it trained
with the camera then runs as user-rl's LeRobot policy, fed the way the export laid the data out.

Real files, LeRobot's real entry point, a few steps on the CPU, offline."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from tests.lerobot.harness import run_in_lerobot
from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.config import BufferConfig
from user_rl.edge.batching import BatchBuilder
from user_rl.wire import user_rl_pb2 as pb

STATE_ONLY = {
    "joints": gym.spaces.Box(-3.0, 3.0, (4,), np.float32),
    "gripper": gym.spaces.Box(0.0, 1.0, (1,), np.float32),
}
WITH_CAMERA = {**STATE_ONLY, "front": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8)}
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
OFFLINE = ["--policy.device=cpu", "--policy.push_to_hub=false", "--num_workers=0", "--batch_size=2", "--steps=3"]
TRAIN = {
    "act": [
        "--policy.type=act",
        "--policy.pretrained_backbone_weights=null",  # else torchvision downloads ImageNet weights
        "--policy.chunk_size=4",
        "--policy.n_action_steps=4",
        "--policy.dim_model=32",
        "--policy.dim_feedforward=64",
        "--policy.n_encoder_layers=1",
        "--policy.n_decoder_layers=1",
    ],
    "diffusion": [
        "--policy.type=diffusion",
        "--policy.horizon=8",
        "--policy.n_action_steps=4",
        "--policy.drop_n_last_frames=3",
        "--policy.down_dims=[16,32]",
        "--policy.diffusion_step_embed_dim=16",
        "--policy.crop_shape=[28,28]",
        "--policy.num_inference_steps=2",
    ],
}


def write_buffer(directory: Path, obs_space: gym.spaces.Dict, episodes: int = 3, length: int = 16) -> None:
    """One robot's episodes, each ended (terminated) with a final observation, as the ingest writes them."""
    rng = np.random.default_rng(0)
    store = PersistentReplay(directory, obs_space, ACTION_SPACE, BufferConfig(segment_mb=0.05), gamma=0.9)
    try:
        stream = store.open_stream("arm-0", 1, "push the block", control_hz=10.0)
        for episode in range(episodes):
            builder = BatchBuilder(obs_space, ACTION_SPACE, capacity=length)
            for step in range(length):
                last = step == length - 1
                builder.add(
                    {key: space.sample() for key, space in obs_space.spaces.items()},
                    rng.uniform(-1, 1, 3).astype(np.float32),
                    float(last),
                    last,
                    False,
                    episode=episode,
                    step=step,
                    policy_version=0,
                    actor=pb.ACTOR_HUMAN,
                    label=pb.LABEL_NONE,
                    label_by=0,
                    sensor_time=10.0 + 0.1 * step,
                    policy_action=np.zeros(3, np.float32),
                    final_obs={key: space.sample() for key, space in obs_space.spaces.items()} if last else None,
                )
            assert store.add(stream, episode + 1, builder.take()[1])
            store.commit()
    finally:
        store.close()


def export(lerobot_python: Path, tmp_path: Path, obs: dict, name: str) -> Path:
    buffer, dataset = tmp_path / f"{name}-buffer", tmp_path / f"{name}-dataset"
    write_buffer(buffer, gym.spaces.Dict(obs))
    run_in_lerobot(lerobot_python, "-m", "user_rl.cli", "buffer", "export", str(buffer), str(dataset))
    return dataset


def lerobot_train(lerobot_python: Path, dataset: Path, kind: str, out: Path) -> Path:
    """`lerobot-train` a few steps on `dataset` as it is; the directory of the policy it saved."""
    train = lerobot_python.parent / "lerobot-train"
    done = subprocess.run(
        [str(train), "--dataset.repo_id=local/user-rl", f"--dataset.root={dataset}", *TRAIN[kind], *OFFLINE]
        + [f"--output_dir={out}", "--save_freq=3", "--log_freq=1", "--eval_freq=0", "--wandb.enable=false"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_LEROBOT_HOME": str(out.parent / "lerobot-home")},
    )
    said = f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"lerobot-train {kind} on {dataset.name}:\n{said}"
    saved = out / "checkpoints" / "last" / "pretrained_model"
    assert (saved / "config.json").is_file() and (saved / "model.safetensors").is_file()
    return saved


@pytest.mark.parametrize("kind", ["act", "diffusion"])
def test_lerobot_train_takes_an_export_with_a_camera_and_a_state_only_one_as_they_are(
    lerobot_python: Path, tmp_path: Path, kind: str
) -> None:
    for name, obs in (("camera", WITH_CAMERA), ("state", STATE_ONLY)):
        dataset = export(lerobot_python, tmp_path, obs, name)
        saved = lerobot_train(lerobot_python, dataset, kind, tmp_path / f"{kind}-{name}")
        inputs = json.loads((saved / "config.json").read_text())["input_features"]
        # what LeRobot took as inputs: the cameras and the state, nothing of ours
        expected = {"observation.state"} | (
            {"observation.images.front"} if name == "camera" else {"observation.environment_state"}
        )
        assert set(inputs) == expected, inputs
        assert inputs["observation.state"]["shape"] == [5]  # gripper then joints, as user-rl feeds them
        if kind == "act" and name == "camera":  # trained in LeRobot, run in user-rl
            assert "chunk (2, 4, 3)" in run_in_lerobot(lerobot_python, "-c", RUN_LEROBOT_TRAINED, str(saved)).stdout


RUN_LEROBOT_TRAINED = """
import sys
import gymnasium as gym
import numpy as np
import torch
from user_rl.policies import make_actor
obs_space = gym.spaces.Dict({
    "joints": gym.spaces.Box(-3.0, 3.0, (4,), np.float32), "gripper": gym.spaces.Box(0.0, 1.0, (1,), np.float32),
    "front": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8)})
action_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
actor = make_actor("lerobot", obs_space, action_space, chunk=4, lerobot={"path": sys.argv[1]})
obs = {k: torch.as_tensor(np.stack([s.sample() for _ in range(2)])) for k, s in obs_space.spaces.items()}
chunk = actor.act_chunk(obs, deterministic=True)
assert chunk.shape == (2, 4, 3) and torch.isfinite(chunk).all(), chunk
print("chunk", tuple(chunk.shape))
"""
