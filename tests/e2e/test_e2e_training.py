"""End to end: `user-rl train` starts Ray, a learner and a sim fleet as separate processes on
loopback ZeroMQ, trains to its goal, and `user-rl eval` confirms the checkpoint on fresh episodes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.harness import evaluate, train


def assert_fleet_ran_as_processes(summary: dict, robots: int) -> None:
    learner = summary["learner"]
    pids = {learner["pid"], *(edge["pid"] for edge in summary["edges"])}
    assert len(pids) == robots + 1 and os.getpid() not in pids, "learner and edges must be separate processes"
    assert learner["rejected"] == {}, learner["rejected"]
    assert len(learner["robots"]) == robots
    for robot_id, robot in learner["robots"].items():
        assert robot["transitions"] > 0, f"{robot_id} contributed nothing"
        assert robot["policy_versions"] >= 3, f"{robot_id} acted with {robot['policy_versions']} policy versions"


@pytest.mark.timeout(900)
def test_four_arms_learn_to_reach(tmp_path: Path) -> None:
    summary = train("configs/reach.yaml", tmp_path, "fleet.num_robots=4", "stop.max_wall_s=600")
    assert summary["stop_reason"] == "goal_reached", summary["stdout"][-3000:]
    assert summary["wall_s"] <= 600 + 60  # goal within 10 minutes (+ start-up and shutdown)
    assert summary["final_eval"]["success_rate"] >= 0.9
    assert_fleet_ran_as_processes(summary, robots=4)
    # The live progress shows rates, versions and success while training.
    assert "/s) | updates" in summary["stdout"] and "success" in summary["stdout"]
    # The checkpoint, on 200 episodes it has never seen. The run stops on its best evaluations, so
    # the checkpoint is a little worse than them: one that stopped on 0.96 then 0.97 scored 0.89,
    # 0.93 and 0.94 on new sets of 100, 100 and 200 episodes. A 0.9 bar on 100 episodes fails such
    # a 93% policy 1 run in 11; 0.85 on 200 fails it 1 run in 36,000 (and a 90% one 1 in 100).
    fresh = evaluate(summary["checkpoint"], episodes=200, seed=7)
    assert fresh["success_rate"] >= 0.85, fresh
    run_dir = Path(summary["run_dir"])
    assert (run_dir / "config.yaml").is_file() and (run_dir / "metrics.jsonl").stat().st_size > 0


@pytest.mark.timeout(900)
def test_gym_env_id_fleet_balances_inverted_pendulum(tmp_path: Path) -> None:
    summary = train("configs/inverted_pendulum.yaml", tmp_path, "stop.max_env_steps=20000")
    assert summary["learner"]["env_steps"] <= 20000
    assert_fleet_ran_as_processes(summary, robots=4)
    # On 20 episodes it has never seen. The run's goal is a perfect evaluation (1000 on each of 10
    # episodes): a checkpoint that merely averaged 980 once dropped the pole in 1 of 5 fresh ones.
    fresh = evaluate(summary["checkpoint"], episodes=20, seed=3)
    assert fresh["mean_return"] >= 950, (fresh, summary["evaluations"])
