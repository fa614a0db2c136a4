"""CurveZMQ on the live links: an enrolled robot streams and gets weights over an encrypted
wire; a stranger, a robot without a key and a revoked robot are refused with a message on both
sides, and a revocation takes effect without restarting the learner."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
import zmq

from tests.support.cli import popen_user_rl
from user_rl.cloud.learner import Learner
from user_rl.config import build_config
from user_rl.edge.link import DataLink, LinkSettings
from user_rl.hal.registry import make_robot
from user_rl.security.keys import generate, revoke
from user_rl.testing.fault_proxy import FaultProxy
from user_rl.testing.learner import serving_learner
from user_rl.testing.wait import free_port, wait_until


@pytest.fixture
def secure_learner(tmp_path: Path):
    keys = tmp_path / "keys"
    generate(keys, ["arm-0", "arm-1"])
    cfg = {
        "robot": {"type": "mujoco_reach", "options": {"episode_steps": 50}},
        "fleet": {"num_robots": 1, "pace_to_learner": False, "control_hz": 100, "batch_transitions": 16},
        "policy": {"hidden": [32]},
        "algo": {"learning_starts": 100, "batch_size": 32},
        "learner": {
            "data_port": free_port(),
            "weights_port": free_port(),
            "torch_threads": 1,
            "publish_every_updates": 20,
        },
        "security": {"curve": "on", "keys_dir": str(keys)},
    }
    config = tmp_path / "secure.yaml"
    config.write_text(yaml.safe_dump(cfg))
    with serving_learner(build_config(cfg), tmp_path / "run") as learner:
        yield learner, config, keys


def edge(config: Path, robot: str, learner: str, weights: str, spool: Path, *overrides: str) -> subprocess.Popen:
    return popen_user_rl(
        "edge",
        str(config),
        *overrides,
        "--robot",
        robot,
        "--learner",
        learner,
        "--weights",
        weights,
        "--spool",
        str(spool),
    )


def expect_line(proc: subprocess.Popen, text: str, timeout: float = 60) -> None:
    """Read the edge's output until `text` shows, then stop it (it would keep trying)."""
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any(text in line for line in seen), timeout, f"the edge to say {text!r}")
    finally:
        proc.kill()
        proc.wait(30)


def robot_status(learner: Learner, robot_id: str) -> dict:
    return learner.status().get("robots", {}).get(robot_id, {})


def test_an_enrolled_robot_trains_over_a_wire_nobody_can_read(secure_learner, tmp_path: Path) -> None:
    learner, config, _ = secure_learner
    with FaultProxy(learner.addresses["data"], record_bytes=1 << 20) as wire:
        proc = edge(config, "arm-0", wire.address, learner.addresses["weights"], tmp_path / "spool")
        try:
            wait_until(
                lambda: (
                    robot_status(learner, "arm-0").get("transitions", 0) >= 200
                    and robot_status(learner, "arm-0").get("latest_version", -1) >= 1
                ),
                90,
                "the enrolled robot to stream and receive a policy",
            )
        finally:
            proc.send_signal(signal.SIGINT)
            output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "edge arm-0: detached" in output, output
    assert learner.status()["rejected"] == {}
    sent = bytes(wire.recorded["up"])
    assert len(sent) > 20_000  # hello, batches and heartbeats went through the recorder ...
    for plain in (b"arm-0", b"reach", b"state", b"red target"):  # ... and none of it is readable
        assert plain not in sent, plain


def test_the_recorder_would_see_a_link_in_the_clear(tmp_path: Path) -> None:
    """The control for the test above: without CurveZMQ the same words are on the wire."""
    context = zmq.Context()
    sink = context.socket(zmq.ROUTER)
    port = sink.bind_to_random_port("tcp://127.0.0.1")
    robot = make_robot("mujoco_reach", robot_id="arm-0")
    with FaultProxy(f"tcp://127.0.0.1:{port}", record_bytes=1 << 16) as wire:
        link = DataLink(
            context,
            wire.address,
            robot.descriptor,
            robot.observation_space,
            robot.action_space,
            settings=LinkSettings(spool_dir=str(tmp_path / "spool")),
        )
        link.hello()

        def arrived() -> bool:
            link.pump()  # repeats the hello until the connection is up
            return bool(sink.poll(100))

        wait_until(arrived, 10, "the hello to arrive")
        link.close()
    robot.close()
    sink.close(0)
    context.term()
    assert b"arm-0" in bytes(wire.recorded["up"]) and b"red target" in bytes(wire.recorded["up"])


def test_strangers_and_revoked_robots_are_refused_on_both_sides(secure_learner, tmp_path: Path) -> None:
    learner, config, keys = secure_learner
    data, weights = learner.addresses["data"], learner.addresses["weights"]

    no_key = edge(config, "arm-9", data, weights, tmp_path / "spool")  # never given a key
    output, _ = no_key.communicate(timeout=60)
    assert no_key.returncode == 2 and "no key file at" in output and "robots/arm-9.key_secret" in output, output

    # A robot with the wrong learner key, or none at all (its link in the clear): it keeps trying (a
    # link that resets mid-handshake looks the same) and says what most likely disagrees.
    good = (keys / "learner.key").read_bytes()
    (tmp_path / "stale").mkdir()
    generate(tmp_path / "stale", [])
    os.replace(tmp_path / "stale" / "learner.key", keys / "learner.key")  # what the robot was given
    try:
        wrong = edge(config, "arm-0", data, weights, tmp_path / "spool")
        expect_line(
            wrong, "cannot reach the learner: handshake_failed: the learner and this robot disagree on encryption"
        )
    finally:
        (keys / "learner.key").write_bytes(good)
    clear = edge(config, "arm-0", data, weights, tmp_path / "spool", "security.curve=off")
    expect_line(clear, "cannot reach the learner: handshake_failed")
    assert "arm-0" not in learner.status().get("robots", {})

    revoke(keys, "arm-1")  # a key taken back before the robot ever connects
    refused = edge(config, "arm-1", data, weights, tmp_path / "spool")
    output, _ = refused.communicate(timeout=60)
    assert refused.returncode == 1, output
    assert "key_refused: the learner does not accept this robot's key" in output
    wait_until(
        lambda: "arm-1 (revoked)" in learner.status()["keys_refused"], 10, "the learner to report the refused key"
    )
    assert "arm-1" not in learner.status().get("robots", {})

    # Revoked while streaming: refused from its next message on, the learner never restarted.
    running = edge(config, "arm-0", data, weights, tmp_path / "spool")
    try:
        wait_until(lambda: robot_status(learner, "arm-0").get("transitions", 0) >= 100, 60, "arm-0 to stream")
        revoke(keys, "arm-0")
        output, _ = running.communicate(timeout=60)
    finally:
        if running.poll() is None:
            running.kill()
    assert running.returncode == 1, output
    assert "the learner refused robot arm-0: not_enrolled" in output
    # Each link rereads enrolled/ on its own (every 0.2 s): the edge may exit on the weights link's
    # refusal while the data link still takes what it had queued. Once the data link refuses a
    # message, it refuses every later one.
    wait_until(
        lambda: learner.status()["rejected"].get("not_enrolled", 0) >= 1, 10, "the learner to count the refused message"
    )
    stored = robot_status(learner, "arm-0")["transitions"]
    time.sleep(1.0)
    assert robot_status(learner, "arm-0")["transitions"] == stored  # nothing more got in
