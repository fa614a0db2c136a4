"""A robot outside the Ray cluster: `user-rl edge` streams to a learner it knows only by
address and detaches cleanly on Ctrl-C; `user-rl attach` adds a robot to a running training."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import yaml

from tests.e2e.harness import run_cli
from tests.support.cli import popen_user_rl, start_user_rl
from user_rl.cloud.buffer.index import BufferIndex
from user_rl.config import build_config
from user_rl.testing.learner import serving_learner
from user_rl.testing.wait import free_port, wait_for_run_dir, wait_until


def test_standalone_edge_streams_and_detaches_cleanly_mid_episode(tmp_path: Path) -> None:
    cfg_dict = {
        "robot": {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 50}},
        "fleet": {"num_robots": 1, "pace_to_learner": False, "control_hz": 100, "batch_transitions": 16},
        "policy": {"hidden": [32]},
        "algo": {"learning_starts": 200, "batch_size": 32},
        "learner": {"data_port": free_port(), "weights_port": free_port(), "torch_threads": 1},
    }
    config = tmp_path / "edge.yaml"
    config.write_text(yaml.safe_dump(cfg_dict))
    with serving_learner(build_config(cfg_dict), tmp_path / "run") as learner:
        proc = popen_user_rl(
            "edge",
            str(config),
            "--robot",
            "arm-x",
            "--learner",
            learner.addresses["data"],
            "--spool",
            str(tmp_path / "spool"),
        )

        def robot() -> dict:
            return learner.status().get("robots", {}).get("arm-x", {})

        wait_until(
            lambda: robot().get("transitions", 0) > 120 and robot().get("latest_version", -1) >= 1,
            90,
            "the edge to stream and receive a policy",
        )
        while learner.env_steps % 50 in (0, 49):  # stop inside an episode
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, output
        assert "edge arm-x: detached after" in output and "(0 batches left in the spool)" in output
        steps = int(output.split("detached after ")[1].split()[0])
        wait_until(lambda: robot().get("detached") is True, 10, "the learner to see the robot leave")
        assert robot()["transitions"] == steps == learner.env_steps  # every step arrived, once
        assert not list((tmp_path / "spool").rglob("*.batch"))
    index = BufferIndex(tmp_path / "run" / "buffer" / "index.sqlite", read_only=True)
    episodes = index.episodes()
    index.close()
    assert (episodes[-1].status, episodes[-1].end_reason) == ("truncated", "detached")
    assert 0 < episodes[-1].length < 50
    assert all(e.status == "truncated" and e.end_reason == "" and e.length == 50 for e in episodes[:-1])


def test_edge_without_a_weights_address_says_what_to_pass(tmp_path: Path) -> None:
    done = run_cli("edge", "configs/reach.yaml", "--robot", "arm-x", "--learner", "tcp://127.0.0.1:5555", timeout=120)
    assert done.returncode == 2 and "--weights tcp://HOST:PORT or set learner.weights_port" in done.stderr


def test_attach_adds_a_robot_to_a_running_training(tmp_path: Path) -> None:
    train, lines, _ = start_user_rl(
        "train",
        "configs/reach.yaml",
        f"run_root={tmp_path / 'runs'}",
        "fleet.num_robots=1",
        "algo.learning_starts=200",
        "algo.batch_size=32",
        "policy.hidden=[32]",
        "stop.max_env_steps=100000",
        "stop.max_wall_s=90",
        "stop.eval_every_s=1000",
        "stop.eval_episodes=2",
    )
    try:
        run_dir = wait_for_run_dir(lines, 120)
        wait_until(lambda: (run_dir / "addresses.json").exists(), 60, "the learner's addresses")

        def attach(*overrides: str) -> subprocess.CompletedProcess:
            return run_cli(
                *("attach", "configs/reach.yaml", "arm-extra", *overrides),
                *("--run-dir", str(run_dir), "--spool", str(tmp_path / "spool"), "--max-steps", "300"),
                timeout=180,
            )

        refused = attach()  # the config's own policy is not the one the run trains
        assert refused.returncode == 2 and "policy: the run trains {'type': 'mlp', 'hidden': [32]}" in refused.stderr
        attach = attach("policy.hidden=[32]")
        assert attach.returncode == 0, attach.stdout + attach.stderr
        assert "edge arm-extra: detached after 300 steps" in attach.stdout

        def extra() -> dict:  # the launch writes the file once its own fleet is placed: on a slow box, after the attach
            status = run_dir / "fleet_status.json"
            return json.loads(status.read_text())["learner_robots"].get("arm-extra", {}) if status.exists() else {}

        wait_until(lambda: extra().get("detached") is True, 60, "the training to see the robot join and leave")
        assert extra()["transitions"] == 300
    finally:
        train.send_signal(signal.SIGINT)
        try:
            train.wait(60)
        except subprocess.TimeoutExpired:
            train.kill()
