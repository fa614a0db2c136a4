"""An edge on a slow uplink: as its unacked backlog grows it sends bigger batches and
compresses cameras harder, reports the backlog to the learner, and returns to its configured
settings once the link recovers. The robot never slows down for the link."""

from __future__ import annotations

import threading
from pathlib import Path

from user_rl.config import build_config
from user_rl.edge.adapt import MIN_JPEG_QUALITY, BacklogAdapter
from user_rl.edge.factory import make_edge
from user_rl.testing.fault_proxy import FaultProxy
from user_rl.testing.learner import serving_learner
from user_rl.testing.wait import wait_until
from user_rl.wire.images import ImageCompression

JPEG = ImageCompression("jpeg", 90)
PNG = ImageCompression("png")


def test_adapter_steps_up_with_the_backlog_and_back_down_when_it_drains() -> None:
    adapter = BacklogAdapter(16, {"wrist": JPEG, "depth": PNG}, max_in_flight=8, max_factor=4)
    assert adapter.update(0) == (16, {"wrist": JPEG, "depth": PNG})
    assert adapter.update(3)[0] == 16  # below the high mark (half the window): unchanged
    size, compression = adapter.update(4)
    assert size == 32 and compression["wrist"].quality == 70 and compression["depth"] == PNG  # PNG is lossless
    size, compression = adapter.update(9)
    assert size == 64 and compression["wrist"].quality == MIN_JPEG_QUALITY
    assert adapter.update(50)[0] == 64  # capped at max_factor
    assert adapter.update(2)[0] == 64  # between the marks: hold, no flapping
    assert adapter.update(1)[0] == 32
    assert adapter.update(0) == (16, {"wrist": JPEG, "depth": PNG})


def test_slow_uplink_makes_the_edge_batch_and_compress_harder_then_recover(tmp_path: Path) -> None:
    cfg = build_config(
        {
            "robot": {"type": "mujoco_reach", "options": {"obs_mode": "image", "image_size": 32}},
            "fleet": {
                "num_robots": 1,
                "pace_to_learner": False,
                "control_hz": 20,
                "batch_transitions": 4,
                "max_in_flight": 8,
                "heartbeat_s": 0.2,
                "compression": {"image": {"quality": 95}},
            },
            "policy": {"hidden": [16]},
            "algo": {"learning_starts": 10**6},  # the link is under test, not learning
        }
    )
    with serving_learner(cfg, tmp_path / "run") as learner:
        built, edges = threading.Event(), []

        def serve(address: str) -> None:  # built, run and closed in one thread: GL contexts are per thread
            edge = make_edge(cfg, 0, address, learner.addresses["weights"], tmp_path / "spool")
            edges.append(edge)
            built.set()
            try:
                edge.run()
                edge.drain(60)
            finally:
                edge.close()

        running = None
        try:
            with FaultProxy(learner.addresses["data"]) as uplink:
                running = threading.Thread(target=serve, args=(uplink.address,), daemon=True)
                running.start()
                assert built.wait(60)
                edge = edges[0]
                wait_until(lambda: learner.env_steps >= 40, 60, "data to flow on the open link")
                assert edge.batch.capacity == 4 and edge.link.compression["image"].quality == 95

                uplink.set(bandwidth_bps=16e3)  # far below what 20 Hz of camera frames need
                steps_before = edge.steps
                wait_until(lambda: edge.adapter.level == edge.adapter.max_level, 60, "the edge to adapt")
                assert edge.batch.capacity == 16 and edge.link.compression["image"].quality == MIN_JPEG_QUALITY
                wait_until(
                    lambda: learner.status()["robots"]["mujoco_reach-0"]["backlog_batches"] >= 4,
                    30,
                    "the learner to hear of the backlog",
                )
                assert edge.steps - steps_before >= 20, "the robot slowed down for the link"

                uplink.set(bandwidth_bps=None)
                wait_until(lambda: edge.adapter.level == 0 and edge.link.unacked <= 1, 60, "the backlog to drain")
                assert edge.batch.capacity == 4 and edge.link.compression["image"].quality == 95
                edge.stop()
                running.join(90)
                assert edge.link.unacked == 0
                assert learner.env_steps == edge.steps  # every step arrived, once
        finally:
            for edge in edges:
                edge.stop()
            if running is not None:
                running.join(30)
