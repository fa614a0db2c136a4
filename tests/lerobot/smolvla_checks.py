"""Run in the LeRobot environment by test_lerobot_smolvla.py: a tiny SmolVLA (LeRobot's own code, on a
tiny SmolVLM written locally) as our actor, measured against LeRobot's own pipeline, trained by
behaviour cloning, and steered while frozen; prints what it found as JSON (the test asserts on it).

    python tests/lerobot/smolvla_checks.py WORK_DIR
"""

import json
import math
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from lerobot.policies.factory import make_pre_post_processors
from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
from save_smolvla import save_smolvla  # this script's directory is on the path
from steering_checks import steered

from user_rl.algos import BCSettings, make_algo
from user_rl.hal.instruction import encode_instruction, instruction_space
from user_rl.policies import make_actor
from user_rl.policies.tiny_smolvlm import tiny_smolvla_fields

work = Path(sys.argv[1])
vlm_dir, saved_dir = work / "tiny_smolvlm", work / "smolvla"
STATE, ACTIONS, CHUNK, SIZE = 6, 4, 8, 32
found: dict = {"parameters": save_smolvla(str(saved_dir), str(vlm_dir), STATE, ACTIONS, CHUNK)}
camera = gym.spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8)
state = gym.spaces.Box(-np.inf, np.inf, (STATE,), np.float32)
told = gym.spaces.Dict({"image": camera, "state": state, "instruction": instruction_space()})
untold = gym.spaces.Dict({"image": camera, "state": state})
bounds = gym.spaces.Box(-1.0, 1.0, (ACTIONS,), np.float32)
rng = np.random.default_rng(0)
rows = 16


def observations(n: int, words: list[str]) -> dict[str, torch.Tensor]:
    return {
        "image": torch.as_tensor(rng.integers(0, 255, (n, SIZE, SIZE, 3)), dtype=torch.uint8),
        "state": torch.as_tensor(rng.normal(0, 1, (n, STATE)), dtype=torch.float32),
        "instruction": torch.as_tensor(np.stack([encode_instruction(words[i % len(words)]) for i in range(n)])),
    }


# 1. A SmolVLA saved by LeRobot: our chunks are LeRobot's preprocessor -> SmolVLA -> postprocessor's
# from the same noise, the task read from the instruction observation.
obs = observations(3, ["touch the red target", "touch the green target", "pick up the cube"])
ours = make_actor("lerobot", told, bounds, chunk=CHUNK, lerobot={"path": str(saved_dir)})
theirs = SmolVLAPolicy.from_pretrained(str(saved_dir))
overrides = {"tokenizer_processor": {"tokenizer_name": str(vlm_dir)}}
pre, post = make_pre_post_processors(theirs.config, pretrained_path=str(saved_dir), preprocessor_overrides=overrides)
noise = torch.randn(3, math.prod(ours.noise_shape), generator=torch.Generator().manual_seed(1))
texts = ["touch the red target", "touch the green target", "pick up the cube"]
their_batch = pre(
    {"observation.state": obs["state"], "observation.images.image": obs["image"].permute(0, 3, 1, 2) / 255.0}
    | {"task": texts}
)
their_chunks = post(theirs.predict_action_chunk(their_batch, noise=noise.view(3, *ours.noise_shape)))
with torch.no_grad():
    our_chunks = ours.to_robot_units(ours.chunk_from_noise(obs, noise))
found["noise_shape"] = list(ours.noise_shape)
found["pipeline_max_difference"] = float((our_chunks - their_chunks[:, : ours.chunk_length].clamp(-1, 1)).abs().max())
found["chunk_shape"] = list(ours.act_chunk(obs, deterministic=True).shape)
found["pretrained"] = bool(ours.pretrained)
found["state_shift_scale"] = [float(ours.observation_state_shift[0]), float(ours.observation_state_scale[0])]
found["image_scale"] = float(ours.observation_images_image_scale.max())  # SmolVLA's images: identity
# the same noise, another instruction: another chunk (the language reaches the actions)
swapped = {**obs, "instruction": obs["instruction"].flip(0)}
with torch.no_grad():
    found["instruction_moves_the_chunk"] = not torch.allclose(
        ours.chunk_from_noise(obs, noise)[0], ours.chunk_from_noise(swapped, noise)[0]
    )
# a robot without an instruction: the task is policy.task
fixed = make_actor("lerobot", untold, bounds, chunk=CHUNK, task="pick up the cube", lerobot={"path": str(saved_dir)})
plain = {k: v for k, v in obs.items() if k != "instruction"}
with torch.no_grad():
    found["task_is_the_fixed_one"] = torch.allclose(
        fixed.chunk_from_noise(plain, noise)[2], ours.chunk_from_noise(obs, noise)[2], atol=1e-5
    )
# a robot with other features (as smolvla_base's, trained on other robots): it takes this one's,
# normalised by its bounds
other = gym.spaces.Dict({"wrist": camera, "state": gym.spaces.Box(-3.0, 3.0, (5,), np.float32)})
wide = gym.spaces.Box(-2.0, 2.0, (3,), np.float32)
adopted = make_actor("lerobot", other, wide, chunk=CHUNK, task="pick up the cube", lerobot={"path": str(saved_dir)})
other_obs = {"wrist": obs["image"], "state": obs["state"][:, :5]}
found["other_robot_chunk_shape"] = list(adopted.act_chunk(other_obs, deterministic=True).shape)
found["other_robot_action_scale"] = adopted.action_scale.tolist()  # the robot's bounds, not the saved stats
found["other_robot_state_scale"] = adopted.observation_state_scale.tolist()

# 2. Mistakes are named.
for name, (space, options) in {
    "no_camera": (gym.spaces.Dict({"state": state}), {"type": "smolvla", **tiny_smolvla_fields(vlm_dir)}),
    "state_too_wide": (
        gym.spaces.Dict({"image": camera, "state": gym.spaces.Box(-1, 1, (40,), np.float32)}),
        {"type": "smolvla", **tiny_smolvla_fields(vlm_dir)},
    ),
}.items():
    try:
        make_actor("lerobot", space, bounds, chunk=CHUNK, lerobot=options)
        found[f"error_{name}"] = None
    except ValueError as exc:
        found[f"error_{name}"] = str(exc)

# 3. Built from its config, it learns by behaviour cloning (LeRobot's own flow-matching loss).
torch.manual_seed(0)
options = {"chunk": CHUNK, "lerobot": {"type": "smolvla", "n_action_steps": 4, **tiny_smolvla_fields(vlm_dir)}}
bc = make_algo("bc", told, bounds, "lerobot", options, BCSettings(actor_lr=1e-3))
target = np.tile([0.5, -0.3, 0.2, 0.0], (rows, CHUNK, 1)).astype(np.float32)
batch = {
    "obs": observations(rows, ["touch the red target"]),
    "action": torch.as_tensor(target[:, 0]),
    "intervened": torch.ones(rows),
    "policy_acted": torch.zeros(rows),
    "action_chunk": torch.as_tensor(target),
    "chunk_intervened": torch.ones(rows, CHUNK),
    "chunk_policy_acted": torch.zeros(rows, CHUNK),
}
losses = [float(bc.update(batch)["bc_loss"]) for _ in range(30)]
found["bc_loss_first_last"] = [float(np.mean(losses[:5])), float(np.mean(losses[-5:]))]
edge = make_actor("lerobot", told, bounds, **options)
edge.load_state_dict(bc.actor.state_dict())  # what an edge does with a published version
two = {key: value[:2] for key, value in batch["obs"].items()}
found["bc_same_on_the_edge"] = bool(
    torch.allclose(edge.act_chunk(two, deterministic=True), bc.actor.act_chunk(two, deterministic=True))
)

# 4. Frozen, steered by DSRL through its noise and corrected by residual RL: its weights never change,
# the executed chunk follows the small actor.
steer_batch = {
    "obs": batch["obs"],
    "next_obs": batch["obs"],
    "action_chunk": batch["action_chunk"][:, :4],
    "reward": torch.ones(rows),
    "terminated": torch.zeros(rows, dtype=torch.bool),
}
path_options = {"chunk": CHUNK, "lerobot": {"path": str(saved_dir)}}
found |= steered(
    lambda settings: make_algo(settings.type, told, bounds, "lerobot", path_options, settings), two, steer_batch
)
print(json.dumps(found))
