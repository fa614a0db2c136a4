"""End to end: `user-rl train` starts Ray, a learner and a sim fleet as separate processes on
loopback ZeroMQ, trains to its goal, and `user-rl eval` confirms the checkpoint on fresh episodes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.harness import evaluate, run_cli, train


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
    # The checkpoint, on 100 episodes it has never seen (20 would fail a 95% policy 1 run in 13).
    fresh = evaluate(summary["checkpoint"], episodes=100, seed=7)
    assert fresh["success_rate"] >= 0.9, fresh
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


@pytest.mark.timeout(900)
def test_train_resume_continues_the_run_directory(tmp_path: Path) -> None:
    small = ("fleet.num_robots=2", "algo.learning_starts=400", "algo.batch_size=64", "stop.eval_every_s=1000",
             "stop.eval_episodes=2")
    first = train("configs/reach.yaml", tmp_path, *small, "stop.max_env_steps=1200")
    run_dir = Path(first["run_dir"])
    done = first["learner"]
    assert done["updates"] > 0 and done["resumed_from"] is None

    second = train("configs/reach.yaml", tmp_path, *small, "stop.max_env_steps=2400", f"resume={run_dir}")
    assert second["run_dir"] == str(run_dir)  # the same directory, not a new run
    resumed = second["learner"]["resumed_from"]
    # Networks, optimisers and counters came back from the first run's final checkpoint ...
    assert resumed["updates"] == done["updates"] and resumed["policy_version"] == done["policy_version"]
    assert resumed["buffer_transitions"] > 0
    # ... and training went on from there, over the first run's data plus the new steps.
    assert second["learner"]["updates"] > done["updates"]
    assert second["learner"]["policy_version"] > done["policy_version"]
    assert second["learner"]["env_steps"] >= 2400 > done["env_steps"]

    # Resuming with another arm model: the policy was made for 3 joints, so every robot is refused.
    other_arm = run_cli("train", "configs/reach.yaml", *small, "stop.max_env_steps=4800", f"resume={run_dir}",
                        "robot.options.arm=4dof", timeout=300)
    assert other_arm.returncode == 1, other_arm.stdout[-3000:] + other_arm.stderr[-3000:]
    assert "user-rl: every robot of the fleet failed: mujoco_reach-" in other_arm.stderr
    assert "the learner refused it: spaces_mismatch" in other_arm.stderr

    missing = run_cli("train", "configs/reach.yaml", f"resume={tmp_path / 'nowhere'}", timeout=120)
    assert missing.returncode != 0 and "holds no checkpoint.pt" in missing.stderr
