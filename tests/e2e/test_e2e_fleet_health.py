"""Fleet health end to end: an edge daemon's process killed with SIGKILL is placed again and
rejoins (the learner's own per-robot counters show the new stream and new data); once the
restart budget is spent the robot is reported failed and the rest of the fleet trains on."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.support.cli import start_user_rl
from user_rl.testing.wait import wait_for_run_dir, wait_until


def read_status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "fleet_status.json").read_text())
    except (OSError, ValueError):  # not written yet
        return {"edges": {}, "learner_robots": {}}


def test_killed_edge_restarts_rejoins_then_fails_alone_when_its_budget_is_spent(tmp_path: Path) -> None:
    proc, lines, reader = start_user_rl(
        "train",
        "configs/reach.yaml",
        f"run_root={tmp_path}",
        "fleet.num_robots=2",
        "fleet.max_restarts=1",
        "algo.learning_starts=300",
        "algo.batch_size=64",
        "policy.hidden=[32]",
        "algo.utd_ratio=2",
        "stop.max_env_steps=7000",
        "stop.max_wall_s=300",
        "stop.eval_every_s=1000",
        "stop.eval_episodes=2",
    )
    try:
        run_dir = wait_for_run_dir(lines, 120)
        first, other = "mujoco_reach-0", "mujoco_reach-1"

        def learner_robot(robot_id: str) -> dict:
            return read_status(run_dir)["learner_robots"].get(robot_id, {})

        def edge(robot_id: str) -> dict:
            return read_status(run_dir)["edges"].get(robot_id, {})

        wait_until(
            lambda: all(learner_robot(r).get("transitions", 0) > 100 for r in (first, other)),
            120,
            "both robots to stream",
        )
        old_pid, before = edge(first)["pid"], learner_robot(first)["transitions"]
        os.kill(old_pid, signal.SIGKILL)
        wait_until(
            lambda: edge(first).get("restarts") == 1 and edge(first).get("pid") not in (None, old_pid),
            90,
            "the edge to be placed again",
        )
        wait_until(
            lambda: (
                learner_robot(first).get("edge_restarts") == 1 and learner_robot(first)["transitions"] > before + 100
            ),
            90,
            "the restarted edge to rejoin",
        )

        os.kill(edge(first)["pid"], signal.SIGKILL)  # the budget (1 restart) is spent now
        wait_until(lambda: edge(first).get("failed"), 90, "the robot to be reported failed")
        still = learner_robot(other)["transitions"]
        wait_until(lambda: learner_robot(other)["transitions"] > still + 300, 90, "the rest of the fleet to train on")
        assert proc.wait(300) == 0, "".join(lines[-60:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    reader.join(10)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "max_env_steps", "".join(lines[-40:])
    edges = {e["robot_id"]: e for e in summary["edges"]}
    assert "no restarts left (fleet.max_restarts=1)" in edges[first]["failed"] and edges[first]["restarts"] == 1
    assert edges[other]["failed"] is None and edges[other]["restarts"] == 0
    assert summary["learner"]["rejected"] == {}
    text = "".join(lines)
    assert f"robot {first}: its edge daemon is gone" in text and f"robot {first} FAILED" in text
