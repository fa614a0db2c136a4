"""Run in the LeRobot environment by test_lerobot_policy.py: measures our LeRobot actor against
LeRobot's own pipeline and prints what it found as JSON (the test asserts on it).

    python tests/lerobot/policy_checks.py ACT_DIR    # saves an ACT there (save_act.py: 3 joints, chunk 10)
"""

import json
import sys

import gymnasium as gym
import numpy as np
import torch
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors
from save_act import save_act  # this script's directory is on the path
from steering_checks import SMALL, steered

from user_rl.algos import BCSettings, DSRLSettings, make_algo
from user_rl.policies import make_actor

act_dir = sys.argv[1]
save_act(act_dir, 3, 10)
found: dict = {}
arm = gym.spaces.Dict({"state": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)})
bounds = gym.spaces.Box(-90.0, 90.0, (3,), np.float32)

# 1. The same chunks as LeRobot's preprocessor → ACT → postprocessor on the saved directory.
ours = make_actor("lerobot", arm, bounds, chunk=10, lerobot={"path": act_dir})
theirs = ACTPolicy.from_pretrained(act_dir)
pre, post = make_pre_post_processors(theirs.config, pretrained_path=act_dir)
states = torch.as_tensor(np.random.default_rng(0).uniform(-60, 60, (8, 3)), dtype=torch.float32)
our_chunks = ours.act_chunk({"state": states})
their_chunks = post(
    theirs.predict_action_chunk(pre({"observation.state": states, "observation.environment_state": states}))
)
found["act_max_difference"] = float((our_chunks - their_chunks.clamp(-90, 90)).abs().max())
found["act_chunk_shape"] = list(our_chunks.shape)
found["pretrained"] = bool(ours.pretrained)

# 2. Mistakes are named.
for name, kwargs in {
    "chunk": dict(space=arm, chunk=4, lerobot={"path": act_dir}),
    "features": dict(
        space=gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (4,), np.float32)}), chunk=10, lerobot={"path": act_dir}
    ),
    "kind": dict(space=arm, chunk=10, lerobot={"type": "pi0"}),
    "field": dict(space=arm, chunk=10, lerobot={"type": "act", "dim_modle": 8}),
    "history": dict(space=arm, chunk=8, lerobot={"type": "diffusion", "n_obs_steps": 2}),
}.items():
    try:
        make_actor("lerobot", kwargs.pop("space"), bounds, **kwargs)
        found[f"error_{name}"] = None
    except (ValueError, FileNotFoundError) as exc:
        found[f"error_{name}"] = str(exc)

# 3. A diffusion policy with a camera, built from its config: plans chunks, learns by behaviour cloning.
torch.manual_seed(0)
camera = gym.spaces.Dict({"state": arm["state"], "wrist": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)})
options = {
    "chunk": 8,
    "lerobot": {
        "type": "diffusion",
        "down_dims": [16, 32],
        "n_action_steps": 4,
        "num_inference_steps": 10,
        "spatial_softmax_num_keypoints": 8,
    },
}
bc = make_algo("bc", camera, bounds, "lerobot", options, BCSettings(actor_lr=1e-3))
rng = np.random.default_rng(1)
rows = 16
target = np.tile([30.0, -20.0, 10.0], (rows, 8, 1)).astype(np.float32)
batch = {
    "obs": {
        "state": torch.as_tensor(rng.uniform(-60, 60, (rows, 3)), dtype=torch.float32),
        "wrist": torch.as_tensor(rng.integers(0, 255, (rows, 8, 8, 3)), dtype=torch.uint8),
    },
    "action": torch.as_tensor(target[:, 0]),
    "intervened": torch.ones(rows),
    "policy_acted": torch.zeros(rows),
    "action_chunk": torch.as_tensor(target),
    "chunk_intervened": torch.ones(rows, 8),
    "chunk_policy_acted": torch.zeros(rows, 8),
}
losses = [float(bc.update(batch)["bc_loss"]) for _ in range(30)]
found["diffusion_loss_first_last"] = [float(np.mean(losses[:5])), float(np.mean(losses[-5:]))]
edge = make_actor("lerobot", camera, bounds, **options)
edge.load_state_dict(bc.actor.state_dict())  # what an edge does with a published version
obs = {key: value[:2] for key, value in batch["obs"].items()}
planned = edge.act_chunk(obs, deterministic=True)
found["diffusion_chunk_shape"] = list(planned.shape)
found["diffusion_same_on_the_edge"] = bool(torch.allclose(planned, bc.actor.act_chunk(obs, deterministic=True)))


# 4. The diffusion policy, frozen, steered by DSRL through its DDIM noise and corrected by residual RL:
# its weights never change, the executed chunk follows the small actor.
ddim = {"chunk": 8, "lerobot": {**options["lerobot"], "noise_scheduler_type": "DDIM", "num_inference_steps": 5}}
state_only = {
    "obs": {"state": batch["obs"]["state"]},
    "next_obs": {"state": batch["obs"]["state"]},
    "action_chunk": batch["action_chunk"],
    "reward": torch.ones(rows),
    "terminated": torch.zeros(rows, dtype=torch.bool),
}
arm_obs = {"state": state_only["obs"]["state"][:2]}
found |= steered(lambda settings: make_algo(settings.type, arm, bounds, "lerobot", ddim, settings), arm_obs, state_only)
try:
    make_algo("dsrl", arm, bounds, "lerobot", {**ddim, "lerobot": options["lerobot"]}, DSRLSettings(**SMALL))  # DDPM
    found["error_dsrl_ddpm"] = None
except ValueError as exc:
    found["error_dsrl_ddpm"] = str(exc)
print(json.dumps(found))
