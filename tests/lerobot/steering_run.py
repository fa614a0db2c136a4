"""Run in the LeRobot environment by test_lerobot_steering.py: a frozen LeRobot base steered through the
whole system (edge <-> learner), as tests/edge/test_edge_steering.py does for a flow base. A learner
and an edge daemon run in this process on loopback ZeroMQ (tests/edge/conftest.py's `running`), the
edge driving the reach sim; prints what it found as JSON (the test asserts on it).

    python tests/lerobot/steering_run.py WORK_DIR BASE ALGO    # BASE: smolvla | diffusion, ALGO: dsrl | residual

The smolvla base is a tiny SmolVLA saved by LeRobot (save_smolvla.py) reading the arm's camera, its
state and the episode's instruction (reach's two-colour task); the diffusion base is LeRobot's
diffusion policy with a DDIM sampler on the arm's state, saved by LeRobot's `save_pretrained`.
"""

import hashlib
import json
import sys
import threading
import time
from pathlib import Path

import torch
from save_smolvla import save_smolvla  # this script's directory is on the path

from user_rl.cloud.learner import Learner
from user_rl.config import build_config
from user_rl.hal.registry import make_robot
from user_rl.policies import make_actor
from user_rl.testing.learner import serving_edge
from user_rl.testing.wait import wait_until

SIZE = 32


def digest(state: dict[str, torch.Tensor]) -> str:
    return hashlib.sha256(b"".join(state[name].numpy().tobytes() for name in sorted(state))).hexdigest()


def base_of(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n.removeprefix("base."): t for n, t in state.items() if n.startswith("base.")}


def main() -> dict:
    """Save the base, run a learner and an edge on it, and say what the edge and the learner ended with."""
    work, base_kind, algo = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    if base_kind == "smolvla":
        options = {"obs_mode": "image", "image_size": SIZE, "targets": "two_colours", "episode_steps": 30}
    else:
        options = {"obs_mode": "state", "episode_steps": 30}
    robot = {"type": "mujoco_reach", "options": {**options, "reward": "sparse"}}
    probe = make_robot("mujoco_reach", robot_id="probe", **robot["options"])
    obs = {k: torch.as_tensor(v).unsqueeze(0) for k, v in probe.reset(seed=0).items()}
    obs_space, action_space = probe.observation_space, probe.action_space
    probe.close()

    saved = work / "base"
    if base_kind == "smolvla":
        chunk = 8
        save_smolvla(str(saved), str(work / "tiny_smolvlm"), obs_space["state"].shape[0], action_space.shape[0], chunk)
    else:
        chunk = 8
        torch.manual_seed(0)
        fields = {
            "type": "diffusion",
            "down_dims": [16, 32],
            "n_action_steps": 4,
            "noise_scheduler_type": "DDIM",
            "num_inference_steps": 3,
        }
        make_actor("lerobot", obs_space, action_space, chunk=chunk, lerobot=fields).policy.save_pretrained(str(saved))
    policy = {"type": "lerobot", "chunk": chunk, "lerobot": {"path": str(saved)}}
    file_base = make_actor("lerobot", obs_space, action_space, **{k: v for k, v in policy.items() if k != "type"})

    base_hash = digest(file_base.state_dict())
    cfg = build_config(
        {
            "robot": robot,
            "fleet": {"num_robots": 1, "batch_transitions": 16},
            "policy": policy,
            "algo": {
                "type": algo,
                "learning_starts": 64,
                "batch_size": 16,
                "steer_hidden": [32],
                "critic_hidden": [32],
            },
            "learner": {"publish_every_updates": 3, "torch_threads": 1},
        }
    )
    found: dict = {}
    started = time.monotonic()
    learner = Learner(cfg, work / "run")
    learner_thread = threading.Thread(target=learner.run, daemon=True)
    learner_thread.start()
    try:
        with serving_edge(cfg, 0, learner, build_timeout_s=120) as edge:  # stopped as the block ends
            found["actor"] = type(edge.actor).__name__
            found["latent"] = edge.actor.latent_dim
            wait_until(lambda: edge.policy_version >= 1, 240, "a first policy version at the edge")
            seen = edge.policy_version  # read before the weights: they may already be one version newer
            first_steer = {n: t.clone() for n, t in edge.actor.state_dict().items() if n.startswith("steer.")}
            wait_until(lambda: edge.policy_version >= seen + 2, 240, "two more policy versions at the edge")
            state = edge.actor.state_dict()
            found["edge_base_is_the_files"] = digest(base_of(state)) == base_hash
            found["small_actor_trained"] = any(not torch.equal(state[n], t) for n, t in first_steer.items())

            # The executed chunk is the small actor's choice: another small actor, another chunk, same base.
            chunk_before = edge.actor.act_chunk(obs, deterministic=True)
            with torch.no_grad():
                edge.actor.steer.trunk[-1].bias.add_(0.5)
            chunk_after = edge.actor.act_chunk(obs, deterministic=True)
            found["chunk_shape"] = list(chunk_after.shape)
            found["chunk_follows_the_small_actor"] = not torch.allclose(chunk_after, chunk_before)
            found["edge_base_still_the_files"] = digest(base_of(edge.actor.state_dict())) == base_hash

            # The base travelled once; every later version moved only the small actor (and the action scaling).
            buffers, weights = learner.trainer.actor_buffers, edge.weights
            trainable, frozen = buffers.own_layout.total_bytes, buffers.base_layout.total_bytes
            found["frozen_bytes"], found["trainable_bytes"] = frozen, trainable
            found["base_parameter_bytes"] = sum(p.numel() * p.element_size() for p in file_base.parameters())
            found["steer_bytes"] = sum(t.numel() * t.element_size() for t in first_steer.values())
            found["received_bytes"], found["completed"] = weights.received_bytes, weights.completed
            found["edge_versions"] = edge.policy_version
    finally:
        learner.stop()
        learner_thread.join(timeout=120)
        found["errors"] = learner.status().get("errors")
        checkpoint = learner.save()
        learner.close()
    # the learner's own base at the end of the run, from its final checkpoint
    actor = torch.load(checkpoint, weights_only=True)["algo"]["actor"]
    found["learner_base_is_the_files"] = digest(base_of(actor)) == base_hash
    found["seconds"] = round(time.monotonic() - started, 1)
    return found


if __name__ == "__main__":  # the learner's trainer is a spawned process: it imports this module
    print(json.dumps(main()))
