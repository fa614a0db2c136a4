"""An e-stop ends the episode: the learner stores the episode in progress at the stop as truncated
(end_reason "estop"), and no stored transition pairs an observation from before the stop with one
after the re-arm. A live learner, real sockets, the e-stop latch a controller's button trips, and
the buffer's own files as the judge."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from user_rl.cloud.buffer.index import BufferIndex
from user_rl.cloud.buffer.segment import read_segment
from user_rl.config import build_config
from user_rl.edge.factory import make_edge
from user_rl.robots.estop import EStopLatch
from user_rl.status import ask_learner, fleet_table
from user_rl.testing.learner import serving_learner
from user_rl.testing.wait import wait_until


def test_an_estop_ends_the_episode_as_truncated_and_nothing_pairs_across_it(tmp_path: Path) -> None:
    cfg = build_config(
        {
            "robot": {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 100}},
            "fleet": {"num_robots": 1, "pace_to_learner": False, "control_hz": 50, "batch_transitions": 16},
            "policy": {"hidden": [32]},
            "algo": {"learning_starts": 10**6},  # the data is under test
            "learner": {"torch_threads": 1},
        }
    )
    with serving_learner(cfg, tmp_path / "run") as learner:
        spool_root, built = tmp_path / "spool", []

        def serve() -> None:  # built, run and closed in its own thread, as the edge service does
            edge = make_edge(cfg, 0, learner.addresses["data"], learner.addresses["weights"], spool_root)
            built.append(edge)
            try:
                edge.run()
                edge.drain(60)
            finally:
                edge.close()

        runner = threading.Thread(target=serve, daemon=True)
        runner.start()
        try:
            wait_until(lambda: built and learner.env_steps > 40, 60, "the robot to stream")
            edge = built[0]
            wait_until(lambda: 10 <= edge._episode_step <= 80, 10, "the robot to be inside an episode")
            latch = EStopLatch.for_robot(spool_root, edge.robot.descriptor.id)
            cut, tripped_at = edge.episodes, time.time()  # the episode in progress (20 steps or more from its end)
            latch.trip("operator: test")
            wait_until(lambda: edge.estops == 1, 5, "the edge to stop")
            cut_length = edge.steps - 100 * cut  # every episode before it ran its 100 steps
            time.sleep(1.0)
            rearmed_at = time.time()
            latch.clear(by="cli:alice")
            wait_until(lambda: edge.steps >= cut_length + 100 * cut + 60, 30, "the robot to act again after re-arming")
            # Who re-armed it, and which stop they cleared, reach `user-rl status` (asked over the wire).
            robot_id = edge.robot.descriptor.id
            wait_until(
                lambda: (ask_learner(learner.addresses["data"])["robots"][robot_id].get("rearmed") or "").startswith(
                    "by cli:alice"
                ),
                15,
                "the re-arm in the learner's status",
            )
            table = fleet_table(ask_learner(learner.addresses["data"]))
            assert f"{robot_id} re-armed by cli:alice" in table and "cleared the robot stop: operator: test" in table, (
                table
            )
            edge.stop()
            runner.join(90)
            assert edge.link.unacked == 0, edge.status()
        finally:
            for edge in built:
                edge.stop()
            runner.join(30)

    index = BufferIndex(tmp_path / "run" / "buffer" / "index.sqlite", read_only=True)
    try:
        episodes = {e.episode: e for e in index.episodes()}
        files = [tmp_path / "run" / "buffer" / s.file for s in index.segments(status=None)]
    finally:
        index.close()
    stopped = episodes[cut]
    print(
        f"episode {cut}: {stopped.status} ({stopped.end_reason!r}) after {stopped.length} steps; "
        f"next: {[(e.episode, e.status, e.length) for e in episodes.values() if e.episode > cut]}"
    )
    assert (stopped.status, stopped.end_reason, stopped.length) == ("truncated", "estop", cut_length)
    assert episodes[cut + 1].length >= 60  # a new episode after the re-arm
    spanning = 0
    for path in files:
        rows = read_segment(path).load()
        succ = np.flatnonzero(rows["prev_row"] >= 0)
        before = rows["sensor_time"][rows["prev_row"][succ]] < tripped_at
        spanning += int((before & (rows["sensor_time"][succ] > rearmed_at)).sum())
    assert spanning == 0, f"{spanning} stored transitions pair an observation from before the stop with one after it"
