"""Robot health and the edge's last error travel in heartbeats to the learner, which answers
`user-rl status ADDRESS` over its data link with one row per robot."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import zmq

from user_rl.config import build_config
from user_rl.edge.daemon import EdgeDaemon, EdgeSettings
from user_rl.hal.robot import Health
from user_rl.policies import make_actor
from user_rl.sim.reach import ReachRobot
from user_rl.status import ask_learner, fleet_table
from user_rl.testing.learner import serving_learner
from user_rl.testing.wait import wait_until


class FlakyArm(ReachRobot):
    """The reach arm, whose health probe reports what the test sets (a motor that overheats)."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.trouble: str | None = None

    def health(self) -> Health:
        return Health(ok=self.trouble is None, detail=self.trouble or "")


def test_health_and_last_error_reach_the_status_asked_over_the_wire(tmp_path: Path) -> None:
    cfg = build_config(
        {
            "robot": {"type": "mujoco_reach"},
            "fleet": {"num_robots": 2, "pace_to_learner": False},
            "policy": {"hidden": [16]},
            "learner": {"torch_threads": 1},
        }
    )
    with serving_learner(cfg, tmp_path / "run") as learner:
        address = learner.addresses["data"]
        context = zmq.Context()
        arms = [FlakyArm(robot_id=f"arm-{i}", seed=i) for i in range(2)]
        edges = [
            EdgeDaemon(
                arm,
                make_actor("mlp", arm.observation_space, arm.action_space, hidden=[16]),
                address,
                learner.addresses["weights"],
                EdgeSettings(pace_to_learner=False, control_hz=100, heartbeat_s=0.2),
                context,
            )
            for arm in arms
        ]
        runners = [threading.Thread(target=edge.run, daemon=True) for edge in edges]
        for runner in runners:
            runner.start()
        try:

            def rows() -> dict:
                return ask_learner(address, timeout_s=10)["robots"]

            wait_until(
                lambda: {r.get("health") for r in rows().values()} == {"ok"} and len(rows()) == 2,
                60,
                "both robots healthy in the learner's answer",
            )
            arms[1].trouble = "motor 2 over 70 C"
            wait_until(lambda: rows()["arm-1"]["health"] == "unhealthy: motor 2 over 70 C", 30, "the probe's word")
            assert rows()["arm-0"]["health"] == "ok" and rows()["arm-0"]["last_error"] is None
            arms[1].trouble = None  # it cooled down: healthy again, and the operator still sees what happened
            wait_until(lambda: rows()["arm-1"]["health"] == "ok", 30, "the arm to recover")
            status = ask_learner(address, timeout_s=10)
            assert status["robots"]["arm-1"]["last_error"] == "robot: motor 2 over 70 C"
            assert all(r["steps_per_second"] > 10 and r["transitions"] > 0 for r in status["robots"].values())

            # The command prints the same table from another process.
            shown = subprocess.run(
                [sys.executable, "-m", "user_rl.cli", "status", address], capture_output=True, text=True, timeout=60
            )
            assert shown.returncode == 0, shown.stderr
            lines = shown.stdout.splitlines()
            assert lines[0].startswith("env steps ") and lines[1].split()[:3] == ["robot", "health", "policy"]
            row = next(line for line in lines if line.startswith("arm-1 "))
            assert " ok " in row and row.endswith("robot: motor 2 over 70 C")
            assert fleet_table(status).splitlines()[1:] and "arm-0" in fleet_table(status)
        finally:
            for edge in edges:
                edge.stop()
            for runner in runners:
                runner.join(30)
            for edge in edges:
                edge.close()
            context.term()


def test_status_names_what_is_wrong_with_its_target(tmp_path: Path, capsys) -> None:
    from user_rl.cli import main

    assert main(["status", str(tmp_path / "nowhere")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["status", str(tmp_path)]) == 2
    assert "holds no fleet_status.json or learner_status.json" in capsys.readouterr().err
    with zmq.Context() as context, context.socket(zmq.ROUTER) as silent:  # a port where nobody answers
        port = silent.bind_to_random_port("tcp://127.0.0.1")
        assert main(["status", f"tcp://127.0.0.1:{port}", "--timeout", "0.5"]) == 2
    assert f"no learner answered at tcp://127.0.0.1:{port} within 0.5 s" in capsys.readouterr().err
    assert main(["status", "tcp://127.0.0.1:1", "--keys", str(tmp_path)]) == 2
    assert "--keys needs --robot" in capsys.readouterr().err
