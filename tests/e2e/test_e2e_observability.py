"""What a lab watches while a run goes on and looks at after it: `user-rl status` on a live run
(from its directory and over the wire), evaluations and learning curves without a stop goal,
TensorBoard logs from the learner, and the end-of-run plots; then the same run resumed (one run
serves both: each `user-rl train` costs the suite a Ray start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.harness import REPO, run_cli
from tests.e2e.harness import train as train_to_end
from user_rl.testing.wait import wait_until

ROBOTS = ("mujoco_reach-0", "mujoco_reach-1")
RUN = (
    "fleet.num_robots=2",
    "policy.hidden=[32]",
    "algo.learning_starts=300",
    "algo.batch_size=64",
    "stop.success_rate=null",
    "stop.max_env_steps=2400",
    "stop.eval_every_s=3",
    "stop.eval_episodes=10",  # long enough that the learner makes updates while one plays
    "stop.eval_every_env_steps=1200",  # one evaluation before the final one however fast the box (CI: 12 s runs)
    "learner.tensorboard_every_s=2",
)


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The status table's robot rows, by robot id (cells split on runs of two or more spaces)."""
    import re

    lines = stdout.splitlines()
    assert lines[1].split()[:3] == ["robot", "health", "policy"], stdout
    return {cells[0]: cells for cells in (re.split(r"\s{2,}", line.strip()) for line in lines[2:])}


def assert_live_rows(stdout: str) -> None:
    rows = table_rows(stdout)
    assert set(rows) == set(ROBOTS), stdout
    for _robot, health, policy, lag, steps, spool, backlog, stored, quarantined, last_error in rows.values():
        assert health == "ok" and policy.startswith("v") and int(policy[1:]) >= 1 and quarantined == "0", stdout
        assert int(lag) >= 0 and float(steps) >= 0 and int(backlog) >= 0, stdout  # a paced sim may wait (0/s)
        assert spool.endswith("B") and int(stored.replace(",", "")) > 0 and last_error == "-", stdout


@pytest.mark.timeout(900)
def test_a_run_without_a_goal_is_watched_live_leaves_curves_and_plots_and_resumes(tmp_path: Path) -> None:
    env = {**os.environ, "MUJOCO_GL": "egl"}
    with open(tmp_path / "train.log", "w") as log:
        train = subprocess.Popen(
            [sys.executable, "-m", "user_rl.cli", "train", "configs/reach.yaml", f"run_root={tmp_path}", *RUN],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def fleet() -> dict:
            found = list(tmp_path.glob("*/fleet_status.json"))
            return json.loads(found[0].read_text()) if found else {}

        def acting_everywhere() -> bool:
            assert train.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
            robots = fleet().get("learner_robots", {})
            return set(robots) == set(ROBOTS) and all(
                (r.get("acting_version") or -1) >= 1 and r["health"] == "ok" for r in robots.values()
            )

        wait_until(acting_everywhere, 240, "both robots acting with a learned policy")
        run_dir = next(tmp_path.glob("*/fleet_status.json")).parent
        from_dir = run_cli("status", str(run_dir), timeout=60)
        assert from_dir.returncode == 0, from_dir.stderr
        assert_live_rows(from_dir.stdout)
        assert "updated" in from_dir.stdout.splitlines()[0]
        address = json.loads((run_dir / "addresses.json").read_text())["data"]
        over_wire = run_cli("status", address, timeout=60)
        assert over_wire.returncode == 0, over_wire.stderr
        assert_live_rows(over_wire.stdout)
        assert train.wait(timeout=400) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        train.kill()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "max_env_steps"
    after = run_cli("status", str(run_dir), timeout=60)
    assert after.returncode == 0 and "finished" in after.stdout.splitlines()[0]

    # Evaluations came on schedule although the config names no goal: a learning curve.
    evals = [
        json.loads(line)["eval"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"eval"' in line
    ]
    assert len(evals) == len(summary["evaluations"]) and evals[-1]["env_steps"] >= 2400, evals  # the final one
    assert evals[0]["env_steps"] < 2400, evals  # and before it, on schedule (at 1,200 env steps, or 3 s)
    assert [e["env_steps"] for e in evals] == sorted(e["env_steps"] for e in evals)
    # Those of the curve ran beside the training (stop.eval_beside_training): the learner went on
    # while they played; the final one held it, so the checkpoint is the version it evaluated.
    assert any(e["updates_after"] > e["updates"] for e in evals[:-1]), evals
    assert evals[-1]["updates_after"] == evals[-1]["updates"], evals

    # The end-of-run plots: PNG images with something drawn on them.
    import matplotlib.image

    for name in ("learning_curve.png", "robots.png"):
        image = matplotlib.image.imread(run_dir / name)
        assert image.shape[0] >= 300 and image.shape[1] >= 600 and np.std(image) > 0.05, name
    assert run_cli("plot", str(run_dir), timeout=120).stdout.split() == [
        str(run_dir / "learning_curve.png"),
        str(run_dir / "robots.png"),
    ]

    # TensorBoard: the learner's curves and the launch's evaluations, in one log directory.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    board.Reload()
    scalars, histograms = set(board.Tags()["scalars"]), set(board.Tags()["histograms"])
    wanted = {
        "rollout/return",
        "rollout/success",
        "buffer/transitions",
        "interventions/rate",
        "policy/version",
        "throughput/env_steps_per_s",
        "throughput/updates_per_s",
        "eval/success_rate",
        "eval/mean_return",
        *(f"robots/{robot}/steps_per_s" for robot in ROBOTS),
    }
    assert wanted <= scalars, wanted - scalars
    assert any(tag.startswith("loss/") for tag in scalars), scalars
    assert "staleness/policy_lag" in histograms
    returns = board.Scalars("rollout/return")
    assert len(returns) >= 3 and returns[-1].step > returns[0].step
    assert [e.step for e in board.Scalars("eval/mean_return")] == [e["env_steps"] for e in evals]

    # Resumed: the same directory, networks, optimisers and counters from the final checkpoint ...
    done = summary["learner"]
    assert done["updates"] > 0 and done["resumed_from"] is None
    second = train_to_end("configs/reach.yaml", tmp_path, *RUN, "stop.max_env_steps=3000", f"resume={run_dir}")
    assert second["run_dir"] == str(run_dir)  # the same directory, not a new run
    resumed = second["learner"]["resumed_from"]
    assert resumed["updates"] == done["updates"] and resumed["policy_version"] == done["policy_version"]
    assert resumed["buffer_transitions"] > 0
    # ... and training went on from there, over the first run's data plus the new steps.
    assert second["learner"]["updates"] > done["updates"]
    assert second["learner"]["policy_version"] > done["policy_version"]
    assert second["learner"]["env_steps"] >= 3000 > done["env_steps"]

    # Resuming with another arm model: the policy was made for 3 joints, so every robot is refused.
    other_arm = run_cli(
        "train",
        "configs/reach.yaml",
        *RUN,
        "stop.max_env_steps=4000",
        f"resume={run_dir}",
        "robot.options.arm=4dof",
        timeout=300,
    )
    assert other_arm.returncode == 1, other_arm.stdout[-3000:] + other_arm.stderr[-3000:]
    assert "user-rl: every robot of the fleet failed: mujoco_reach-" in other_arm.stderr
    assert "the learner refused it: spaces_mismatch" in other_arm.stderr

    missing = run_cli("train", "configs/reach.yaml", f"resume={tmp_path / 'nowhere'}", timeout=120)
    assert missing.returncode != 0 and "holds no checkpoint.pt" in missing.stderr
