"""A chunk policy end to end: the edge infers once per chunk of H actions and executes them one per
step; every row says which action of its chunk it was; the learner's sampler hands back each row's
next H executed actions, and says who executed them."""

from __future__ import annotations

import numpy as np

from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb

H = 4


def test_edges_execute_flow_chunks_and_the_learner_samples_them_back(running) -> None:
    learner, edges = running(
        [
            "fleet.num_robots=2",
            "policy.type=flow",
            f"policy.chunk={H}",
            "policy.flow_steps=2",
            "policy.hidden=[32]",
            "algo.type=bc",
            "algo.learning_starts=200",
            "algo.batch_size=32",
            "learner.publish_every_updates=5",
            "fleet.batch_transitions=16",
            "intervention.scripted=true",
        ],
        {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 30, "reward": "sparse"}},
    )
    wait_until(lambda: all(e.policy_version >= 2 for e in edges), 120, "two policy versions at every edge")
    wait_until(lambda: learner.env_steps >= 1500, 120, "1,500 env steps")
    buffer = learner.buffer
    assert buffer.settings.action_horizon == H
    batch = buffer.sample(4096, np.random.default_rng(0))
    assert batch["action_chunk"].shape == (4096, H, 3)

    by_policy = (batch["chunk_actor"] == pb.ACTOR_POLICY) & batch["chunk_mask"]
    policy_rows = by_policy[:, 0] & (batch["policy_version"] >= 0)
    assert policy_rows.sum() > 100
    assert set(np.unique(batch["chunk_step"][policy_rows, 0])) == set(range(H))
    # A chunk the policy executed to its end counts 0, 1, ..., H-1 along the following rows.
    whole = policy_rows & by_policy.all(1) & (batch["chunk_step"][:, 0] == 0)
    assert whole.sum() > 20
    np.testing.assert_array_equal(batch["chunk_step"][whole], np.tile(np.arange(H), (whole.sum(), 1)))
    # Where the policy drove, the executed action is its proposal (but where the safety filter shrank
    # one at a joint limit).
    same = np.abs(batch["action"] - batch["policy_action"]).max(1) < 1e-6
    assert same[policy_rows].mean() > 0.97
    # While the scripted expert drives, the policy's chunk is dropped every step: after the first step
    # of a take-over (proposed mid-chunk) each proposal starts a new chunk.
    scripted = (batch["chunk_actor"] == pb.ACTOR_SCRIPTED) & batch["chunk_mask"]
    driving = scripted[:, 0] & scripted[:, 1]
    assert driving.sum() > 20 and (batch["chunk_step"][driving, 1] == 0).all()
    for edge in edges:  # one inference per chunk while the policy drives (plus restarts)
        assert edge.chunks.inferences < 0.6 * edge.steps, (edge.chunks.inferences, edge.steps)


def test_a_vla_with_a_frozen_pretrained_backbone_trains_its_head_through_the_learner(running, tmp_path) -> None:
    """policy.weights names a local safetensors file with the backbone; policy.freeze keeps it: the
    versions edges receive carry exactly the file's backbone, and a head that moves."""
    import torch
    from safetensors.torch import save_file

    from user_rl.hal.registry import make_robot
    from user_rl.policies import make_actor

    robot_cfg = {
        "type": "mujoco_reach",
        "options": {"obs_mode": "image", "image_size": 32, "camera": "top", "targets": "table", "episode_steps": 30},
    }
    robot = make_robot("mujoco_reach", robot_id="probe", **robot_cfg["options"])
    pretrained = make_actor("vla", robot.observation_space, robot.action_space, chunk=H, size="tiny")
    robot.close()
    backbone = {name: t.contiguous() for name, t in pretrained.state_dict().items() if name.startswith("encoder.")}
    save_file(backbone, str(tmp_path / "backbone.safetensors"))

    learner, edges = running(
        [
            "fleet.num_robots=1",
            "policy.type=vla",
            f"policy.chunk={H}",
            "policy.flow_steps=2",
            f"policy.weights={tmp_path / 'backbone.safetensors'}",
            "policy.freeze=[encoder]",
            "algo.type=bc",
            "algo.learning_starts=100",
            "algo.batch_size=16",
            "learner.publish_every_updates=5",
            "fleet.batch_transitions=16",
            "intervention.scripted=true",
        ],
        robot_cfg,
    )
    edge = edges[0]
    wait_until(lambda: edge.policy_version >= 1, 120, "a first policy version at the edge")
    seen = edge.policy_version  # read before the weights: they may already be one version newer
    first_head = {n: t.clone() for n, t in edge.actor.state_dict().items() if n.startswith("velocity_net.")}
    wait_until(lambda: edge.policy_version >= seen + 2, 120, "two more policy versions at the edge")
    state = edge.actor.state_dict()
    for name, tensor in backbone.items():
        assert torch.equal(state[name], tensor), f"{name} is not the file's"
    assert any(not torch.equal(state[n], t) for n, t in first_head.items()), "the head did not train"
    # The frozen backbone travelled once: every later version moved only the trainable bytes.
    buffers, weights = learner.trainer.actor_buffers, edge.weights
    trainable, frozen = buffers.own_layout.total_bytes, buffers.base_layout.total_bytes
    received, completed = weights.received_bytes, weights.completed
    print(f"{completed} versions: {received:,} bytes received; {frozen:,} frozen + {trainable:,} trainable each")
    assert frozen > 0 and completed >= 3
    # (at most one more version in flight: its bytes may be in before it counts as completed)
    assert frozen + completed * trainable <= received <= frozen + (completed + 1) * trainable
