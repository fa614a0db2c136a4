"""A real robot (the example arm driver) that stops answering mid-run: its edge daemon is restarted,
and when it hangs again with the budget spent the robot is failed; the other robot trains on.
The arm's controller answers at 50 Hz like a real one: a real robot is not paced to the learner, so
an arm stepping as fast as it could would take the run's whole step budget before the hang is noticed.
The controller goes silent for arm 0 after 60 moves on a connection (a pulled cable); the driver would
wait 60 s for an answer, so the launch's `fleet.stall_s` is what notices."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.example_arm import arm_controller

REPO = Path(__file__).resolve().parents[2]


def test_a_robot_that_stops_answering_is_restarted_then_failed(tmp_path: Path, arm_driver: dict) -> None:
    config = tmp_path / "arm.yaml"
    with arm_controller("--rate-hz", "50", "--hang", "example_arm-0:60") as controller:
        config.write_text(
            yaml.safe_dump(
                {
                    "name": "arm",
                    "robot": {
                        "type": "example_arm",
                        "options": {"controller": controller, "timeout_s": 60, "episode_steps": 20},
                    },
                    "fleet": {"num_robots": 2, "batch_transitions": 16, "stall_s": 2.0, "max_restarts": 1},
                    "policy": {"hidden": [32]},
                    "algo": {"learning_starts": 100, "batch_size": 32},
                    "stop": {"max_env_steps": 1500, "max_wall_s": 180, "eval_every_s": 1000, "eval_episodes": 2},
                }
            )
        )
        done = subprocess.run(
            [sys.executable, "-m", "user_rl.cli", "train", str(config), f"run_root={tmp_path / 'runs'}"],
            cwd=REPO,
            env=arm_driver,
            capture_output=True,
            text=True,
            timeout=400,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "robot example_arm-0: the robot stopped answering" in done.stdout
    assert "restarting it (1 of 1)" in done.stdout and "robot example_arm-0 FAILED" in done.stdout
    (summary_path,) = (tmp_path / "runs").glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    edges = {e["robot_id"]: e for e in summary["edges"]}
    assert "stopped answering" in edges["example_arm-0"]["failed"] and edges["example_arm-0"]["restarts"] == 1
    assert edges["example_arm-1"]["failed"] is None
    assert summary["stop_reason"] == "max_env_steps"  # the healthy robot took over the failed one's share
    robots = summary["learner"]["robots"]
    assert robots["example_arm-0"]["transitions"] <= 2 * 60 and robots["example_arm-0"]["edge_restarts"] == 1
    assert robots["example_arm-1"]["transitions"] > 1500 - 2 * 60
