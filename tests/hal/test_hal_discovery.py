"""`user-rl hal discover`: simulator slots from the CPU count, configured robots probed, and a
driver that a separately installed package registers through an entry point is found, probed
and launched without touching this repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.example_arm import arm_controller

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "user_rl.cli", *args],
        cwd=REPO,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_discover_lists_sim_slots_per_core_as_a_table_and_json() -> None:
    table = cli("hal", "discover", "--sim-slots", "3")
    assert table.returncode == 0, table.stderr
    assert "mujoco_reach slots  mujoco_reach  sim:mujoco_reach  3" in table.stdout
    report = json.loads(cli("hal", "discover", "--json").stdout)
    slots = {d["resource"]: d["count"] for d in report["devices"] if d["kind"] == "sim"}
    assert slots == {"sim:mujoco_reach": os.cpu_count(), "sim:gym": os.cpu_count()}
    assert report["resources"] == {k: float(v) for k, v in slots.items()}
    assert not [d for d in report["devices"] if d["kind"] == "gpu"]  # this machine has none; torch says so


def arm_config(tmp_path: Path, controller: str, robots: int = 2) -> Path:
    config = tmp_path / "arm.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "arm",
                "robot": {"type": "example_arm", "options": {"controller": controller, "episode_steps": 20}},
                "fleet": {"num_robots": robots, "pace_to_learner": True, "batch_transitions": 16},
                "policy": {"hidden": [32]},
                "algo": {"learning_starts": 100, "batch_size": 32},
                "stop": {"max_env_steps": 400, "max_wall_s": 120, "eval_every_s": 1000, "eval_episodes": 2},
            }
        )
    )
    return config


def test_entry_point_driver_is_discovered_and_probed(tmp_path: Path, arm_driver: dict) -> None:
    with arm_controller() as controller:
        report = json.loads(
            cli("hal", "discover", str(arm_config(tmp_path, controller)), "--json", env=arm_driver).stdout
        )
    robots = [d for d in report["devices"] if d["kind"] == "robot"]
    assert [(d["name"], d["model"], d["resource"], d["status"]) for d in robots] == [
        ("example_arm-0", "example_arm", "robot:example_arm-0", "ok"),
        ("example_arm-1", "example_arm", "robot:example_arm-1", "ok"),
    ]
    assert "50 Hz" in robots[0]["detail"]  # the rate the arm's controller runs at
    described = robots[0]["descriptor"]  # the device model: identity, node, spaces, rate, limits, health
    assert (described["kind"], described["model"], described["id"], described["control_hz"]) == (
        "robot",
        "example_arm",
        "example_arm-0",
        50.0,
    )
    assert described["extra"]["firmware"] == "example-arm-fw-1.2"
    assert described["node"] == robots[0]["node"] == os.uname().nodename
    assert described["action_space"].startswith("float32 (") and described["observation_space"]
    assert described["health"] == {"ok": True, "detail": ""}
    assert report["resources"]["robot:example_arm-0"] == 1.0

    # the controller is off (unplugged): reported, exit 1, and left out of the node's resources
    gone = cli("hal", "discover", str(arm_config(tmp_path, controller)), "--json", env=arm_driver)
    assert gone.returncode == 1
    report = json.loads(gone.stdout)
    assert all(
        d["status"].startswith("unreachable: ConnectionRefusedError") for d in report["devices"] if d["kind"] == "robot"
    )
    assert not any(k.startswith("robot:") for k in report["resources"])


def test_entry_point_driver_is_launched(tmp_path: Path, arm_driver: dict) -> None:
    with arm_controller("--rate-hz", "200") as controller:  # a quick arm: the run is over sooner
        done = cli(
            "train", str(arm_config(tmp_path, controller)), f"run_root={tmp_path / 'runs'}", env=arm_driver, timeout=600
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (summary_path,) = (tmp_path / "runs").glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["stop_reason"] == "max_env_steps"
    assert set(summary["learner"]["robots"]) == {"example_arm-0", "example_arm-1"}
    assert all(r["transitions"] > 0 for r in summary["learner"]["robots"].values())
    assert sorted(summary["placement"]) == ["edge:example_arm-0", "edge:example_arm-1", "learner"]
