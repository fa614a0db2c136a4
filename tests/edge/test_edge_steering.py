"""A frozen flow policy steered through the whole system (edge <-> learner): the edge runs the
steered actor, every version it receives carries the base exactly as the file had it and a small
actor that moves, the base's bytes travel once, and the executed chunk follows the small actor."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from user_rl.hal.registry import make_robot
from user_rl.policies import make_actor
from user_rl.policies.steering import NoiseSteeredActor, ResidualChunkActor
from user_rl.policies.weights import save_weights
from user_rl.testing.wait import wait_until

H = 4
ROBOT = {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 30, "reward": "sparse"}}
FLOW = {"chunk": H, "flow_steps": 2, "hidden": [32]}
ACTORS = {"dsrl": NoiseSteeredActor, "residual": ResidualChunkActor}


def digest(state: dict[str, torch.Tensor]) -> str:
    return hashlib.sha256(b"".join(state[name].numpy().tobytes() for name in sorted(state))).hexdigest()


@pytest.mark.parametrize("algo", sorted(ACTORS))
def test_the_edge_runs_the_trained_small_actor_on_the_unchanged_base(running, tmp_path: Path, algo: str) -> None:
    robot = make_robot("mujoco_reach", robot_id="probe", **ROBOT["options"])
    obs = {k: torch.as_tensor(v).unsqueeze(0) for k, v in robot.reset(seed=0).items()}
    base = make_actor("flow", robot.observation_space, robot.action_space, **FLOW)
    robot.close()
    save_weights(base, tmp_path / "base.safetensors")
    base_hash = digest(base.state_dict())

    learner, (edge,) = running(
        [
            "fleet.num_robots=1",
            "policy.type=flow",
            *(f"policy.{key}={value}" for key, value in FLOW.items()),
            f"policy.weights={tmp_path / 'base.safetensors'}",
            f"algo.type={algo}",
            "algo.learning_starts=200",
            "algo.batch_size=32",
            "algo.steer_hidden=[32]",
            "algo.critic_hidden=[32]",
            "learner.publish_every_updates=5",
            "fleet.batch_transitions=16",
        ],
        ROBOT,
    )
    assert type(edge.actor) is ACTORS[algo]
    wait_until(lambda: edge.policy_version >= 1, 120, "a first policy version at the edge")
    seen = edge.policy_version  # read before the weights: they may already be one version newer
    first_steer = {n: t.clone() for n, t in edge.actor.state_dict().items() if n.startswith("steer.")}
    wait_until(lambda: edge.policy_version >= seen + 2, 120, "two more policy versions at the edge")
    state = edge.actor.state_dict()
    received_base = {n.removeprefix("base."): t for n, t in state.items() if n.startswith("base.")}
    assert digest(received_base) == base_hash, "the base the edge runs is not the file's"
    assert any(not torch.equal(state[n], t) for n, t in first_steer.items()), "the small actor did not train"

    # The executed chunk is the small actor's choice: another small actor, another chunk, same base.
    chunk = edge.actor.act_chunk(obs, deterministic=True)
    with torch.no_grad():
        edge.actor.steer.trunk[-1].bias.add_(0.5)
    assert not torch.allclose(edge.actor.act_chunk(obs, deterministic=True), chunk)
    assert (
        digest({n.removeprefix("base."): t for n, t in edge.actor.state_dict().items() if n.startswith("base.")})
        == base_hash
    )

    # The base travelled once; every later version moved only the small actor (and the action scaling).
    buffers, weights = learner.trainer.actor_buffers, edge.weights
    trainable, frozen = buffers.own_layout.total_bytes, buffers.base_layout.total_bytes
    steer_bytes = sum(t.numel() * t.element_size() for t in first_steer.values())
    assert frozen == sum(p.numel() * p.element_size() for p in base.parameters())
    assert steer_bytes <= trainable < steer_bytes + 1024
    received, completed = weights.received_bytes, weights.completed
    assert frozen + completed * trainable <= received <= frozen + (completed + 1) * trainable
