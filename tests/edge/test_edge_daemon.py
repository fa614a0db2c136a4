"""The edge daemon against a real learner over loopback ZeroMQ (threads in one process)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from tests.support import nested_gym
from tests.support.edges import edge_without_learner, small_actor
from user_rl.edge.daemon import EdgeDaemon, EdgeSettings
from user_rl.hal.registry import make_robot
from user_rl.testing.wait import wait_until


def test_camera_fleet_streams_uint8_images_and_receives_policies(running) -> None:
    learner, edges = running(
        [
            "fleet.num_robots=2",
            "algo.learning_starts=200",
            "algo.batch_size=32",
            "policy.hidden=[32]",
            "learner.publish_every_updates=5",
            "fleet.batch_transitions=16",
        ],
        {"type": "mujoco_reach", "options": {"obs_mode": "image", "image_size": 32}},
    )
    wait_until(lambda: all(e.policy_version >= 2 for e in edges), 120, "two policy versions at every edge")
    batch = learner.buffer.sample(64, np.random.default_rng(0))
    assert batch["obs/image"].dtype == np.uint8 and batch["obs/image"].shape[1:] == (32, 32, 3)
    assert batch["next_obs/image"].any(), "images arrived empty"
    assert learner.updates > 0
    status = learner.status()
    assert set(status["robots"]) == {"mujoco_reach-0", "mujoco_reach-1"}
    assert status["rejected"] == {}


def test_nested_camera_observations_arrive_flat_and_the_envs_own_success_flag_labels_episodes(running) -> None:
    """An env shaped like gym-hil's Panda (tests/support/nested_gym.py: `pixels: {front, wrist}`, success
    in `info["succeed"]`) through the gym driver: the buffer holds obs/pixels.front and obs/pixels.wrist,
    DrQ trains on them and publishes, and the episodes its expert drives (the scripted intervener's
    demonstrations) count as successes, those the untrained policy runs out of time in as failures."""
    learner, (edge,) = running(
        [
            "fleet.num_robots=1",
            "algo.type=drq",
            "algo.learning_starts=64",
            "algo.batch_size=16",
            "policy.hidden=[16]",
            "learner.publish_every_updates=5",
            "fleet.batch_transitions=8",
            "intervention.scripted=true",
            "intervention.demo_episodes=3",
            "intervention.watched_fraction=0.0",
        ],
        {"type": "gym", "options": {"env_id": nested_gym.ENV_ID, "success_key": "succeed"}},
    )
    robot_id = edge.robot.descriptor.id

    def stored() -> dict:
        return learner.status()["robots"].get(robot_id, {})

    wait_until(lambda: edge.policy_version >= 2 and stored().get("episodes", 0) >= 5, 120, "2 versions, 5 episodes")
    batch = learner.buffer.sample(64, np.random.default_rng(0))
    assert {k for k in batch if k.startswith("obs/")} == {f"obs/{k}" for k in nested_gym.FLAT_KEYS}
    for camera in ("pixels.front", "pixels.wrist"):
        assert batch[f"obs/{camera}"].dtype == np.uint8 and batch[f"obs/{camera}"].shape[1:] == (16, 16, 3)
    assert (batch["next_obs/pixels.wrist"] > 100).all()  # 200 - step: the wrist's own frames, not the front's
    robot = stored()
    assert 0.0 < robot["recent_success"] < 1.0, robot  # the demonstrations succeeded, the policy's tries did not
    assert learner.updates > 0 and learner.status()["rejected"] == {}


def test_paced_fleet_never_exceeds_its_step_budget(running) -> None:
    learner, edges = running(
        [
            "fleet.num_robots=2",
            "algo.learning_starts=100",
            "algo.batch_size=16",
            "policy.hidden=[16]",
            "stop.max_env_steps=600",
            "fleet.batch_transitions=8",
        ],
        {"type": "gym", "options": {"env_id": "InvertedPendulum-v5"}},
    )
    wait_until(lambda: sum(e.steps for e in edges) >= 600, 120, "the step budget to be used")
    time.sleep(1.0)  # edges must now hold, not step on
    assert sum(e.steps for e in edges) == 600
    assert learner.env_steps == 600  # every step arrived and was acked
    assert all(e.link.unacked == 0 for e in edges)


def test_unpaced_edge_keeps_acting_while_no_learner_answers(tmp_path: Path) -> None:
    """A real robot never waits for the cloud: with no learner up it acts and keeps its batches."""
    context = zmq.Context()
    robot = make_robot("gym", env_id="InvertedPendulum-v5", robot_id="lonely", seed=0)
    edge = edge_without_learner(robot, EdgeSettings(pace_to_learner=False, batch_transitions=10), context)
    status = edge.run(max_steps=200)
    assert status["steps"] == 200
    assert status["unacked_batches"] == 20  # kept in the disk spool until a learner acknowledges them
    assert len(list(Path(edge.link.spool.directory).glob("*.batch"))) == 20
    edge.close()
    context.term()


def test_a_failing_weight_receiver_shows_in_the_status_and_starts_over(tmp_path: Path) -> None:
    """A policy version the receiver cannot take used to kill its thread with no trace: now a malformed
    one (a tensor of shape (-2, 2)) is dropped and counted, one it cannot hold (4 TiB) is logged and
    shown in the edge's status, and the next version arrives either way."""
    from user_rl.wire import user_rl_pb2 as pb
    from user_rl.wire.codec import decode, encode, envelope
    from user_rl.wire.weights import pack

    context = zmq.Context()
    server = context.socket(zmq.ROUTER)  # a weights server that first sends a malformed version
    server.setsockopt(zmq.LINGER, 0)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    robot = make_robot("gym", env_id="InvertedPendulum-v5", robot_id="w", seed=0)
    actor = small_actor(robot)
    edge = EdgeDaemon(robot, actor, "tcp://127.0.0.1:1", f"tcp://127.0.0.1:{port}", EdgeSettings(), context)

    def send_version(version: int, state: dict, shape: list[int] | None = None) -> None:
        assert server.poll(10_000), "the receiver did not ask for weights"
        identity, *frames = server.recv_multipart()
        assert decode(frames).kind == "weights_request"
        packed = pack(version, state)
        announce = packed.announce
        if shape is not None:  # a first tensor of this shape, sizes to match
            announce.tensors[0].shape[:] = shape
            if min(shape) > 0:
                announce.total_bytes += 4 * shape[0] * shape[1]
                announce.chunk_bytes = 2**30
                announce.num_chunks = -(-announce.total_bytes // 2**30)
        server.send_multipart([identity, *encode(envelope(weights_announce=announce))])
        for index, chunk in enumerate(packed.chunks):
            head = envelope(weights_chunk=pb.WeightsChunk(version=version, index=index))
            server.send_multipart([identity, *encode(head, {"bytes": np.frombuffer(chunk, np.uint8)})])

    try:
        assert edge.status()["errors"] == {}
        send_version(1, actor.state_dict(), shape=[-2, 2])
        wait_until(lambda: edge.weights.errors == 1, 10, "the malformed version to be dropped")
        edge.weights.resend_s = 0.5  # it asks again soon (it dropped what it was collecting)
        send_version(2, actor.state_dict(), shape=[2**20, 2**20])
        wait_until(lambda: edge.status()["errors"], 10, "the failure to show")
        error = edge.status()["errors"]["weights"]
        print("status errors:", edge.status()["errors"])
        assert error.startswith("MemoryError: ") and error.endswith("(failed 1x, started over each time)")
        send_version(3, actor.state_dict())  # the receiver started over: it asks again and gets the next version
        version, _ = edge.weights.wait_for(3, timeout=10)
        assert version == 3
    finally:
        edge.close()
        server.close(0)
        context.term()


def test_a_real_robot_is_never_paced() -> None:
    """Pacing holds a robot between steps while the learner is behind or away: only a sim may do that."""

    class Arm(type(make_robot("gym", env_id="InvertedPendulum-v5"))):
        device_kind = "robot"

    robot = Arm(env_id="InvertedPendulum-v5", robot_id="real")
    actor = small_actor(robot)
    with pytest.raises(ValueError, match="real: pace_to_learner is for simulators; a real robot never waits"):
        EdgeDaemon(robot, actor, "tcp://127.0.0.1:1", "tcp://127.0.0.1:1", EdgeSettings(pace_to_learner=True))
    robot.close()
