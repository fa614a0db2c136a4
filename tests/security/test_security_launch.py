"""A whole training with CurveZMQ on: the placed learner, the placed edges and the launch's own
evaluator all speak over encrypted, authenticated links, and nothing is refused."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.harness import train
from user_rl.security.keys import generate


def test_a_training_runs_end_to_end_with_curve_on(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate(keys, ["mujoco_reach-0", "mujoco_reach-1"])
    summary = train(
        "configs/reach.yaml",
        tmp_path / "runs",
        "fleet.num_robots=2",
        "security.curve=on",
        f"security.keys_dir={keys}",
        "algo.learning_starts=200",
        "algo.batch_size=32",
        "policy.hidden=[32]",
        "stop.max_env_steps=1200",
        "stop.eval_episodes=2",
        timeout=600,
    )
    learner = summary["learner"]
    assert learner["rejected"] == {} and learner["keys_refused"] == {}
    assert all(robot["transitions"] > 0 and robot["policy_versions"] >= 1 for robot in learner["robots"].values())
    assert summary["final_eval"]["episodes"] == 2  # the evaluator got its weights over the encrypted link
