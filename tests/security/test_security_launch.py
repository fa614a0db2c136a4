"""A whole training with CurveZMQ on: the placed learner, the placed edges and the launch's own
evaluator all speak over encrypted, authenticated links, and nothing is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from user_rl.security.keys import generate

REPO = Path(__file__).resolve().parents[2]


def test_a_training_runs_end_to_end_with_curve_on(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate(keys, ["mujoco_reach-0", "mujoco_reach-1"])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "user_rl.cli",
            "train",
            "configs/reach.yaml",
            f"run_root={tmp_path / 'runs'}",
            "fleet.num_robots=2",
            "security.curve=on",
            f"security.keys_dir={keys}",
            "algo.learning_starts=200",
            "algo.batch_size=32",
            "policy.hidden=[32]",
            "stop.max_env_steps=1200",
            "stop.eval_episodes=2",
        ],
        cwd=REPO,
        env={**os.environ, "MUJOCO_GL": "egl"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (summary_path,) = (tmp_path / "runs").glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    learner = summary["learner"]
    assert learner["rejected"] == {} and learner["keys_refused"] == {}
    assert all(robot["transitions"] > 0 and robot["policy_versions"] >= 1 for robot in learner["robots"].values())
    assert summary["final_eval"]["episodes"] == 2  # the evaluator got its weights over the encrypted link
