"""A LeRobot robot and a LeRobot teleoperator in a short training run.

Both are plugins defined by the test (tests/lerobot/plugins), installed the way LeRobot finds
third-party devices: a simulated arm whose motor bus is calibrated like an SO arm's, and a
gamepad whose presses follow a script. `user-rl edge` runs in the LeRobot environment and
streams to a learner in this process; the learner's buffer is the judge of what happened.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from tests.lerobot.harness import install_plugins, run_in_lerobot
from user_rl.cloud.buffer.episodes import Episode, EpisodeFilter, buffer_spaces, read_episodes
from user_rl.config import build_config
from user_rl.testing import lerobot_env
from user_rl.testing.learner import serving_learner
from user_rl.testing.wait import free_port
from user_rl.wire import user_rl_pb2 as pb

STEPS = 600
EPISODE_STEPS = 40
PAD_POSE = [30.0, -20.0, 10.0]  # degrees: where the person's pad drives the arm
# Reads of the pad (one per control step while nobody else drives): hold the intervention button
# over reads 50-69, press success at 100 and re-record at 150.
PAD = {"type": "sim_pad", "id": "pad", "pose": PAD_POSE, "intervene": [[50, 70]], "success": [100], "rerecord": [150]}


def run_config() -> dict:
    return {"robot": {"type": "lerobot", "options": {"robot": {"type": "sim_arm", "id": "arm_a"}, "control_hz": 200,
                                                     "episode_steps": EPISODE_STEPS, "calibrate": True}},
            "fleet": {"num_robots": 1, "control_hz": 200, "batch_transitions": 16},
            "policy": {"hidden": [32]}, "algo": {"learning_starts": 100, "batch_size": 32},
            "reward": {"type": "labels"}, "intervention": {"teleoperator": PAD},
            "learner": {"data_port": free_port(), "weights_port": free_port(), "torch_threads": 1,
                        "publish_every_updates": 20}}


@pytest.fixture(scope="module")
def lerobot_run(lerobot_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Learner here, `user-rl edge` for the LeRobot arm in the LeRobot environment, STEPS steps."""
    tmp = tmp_path_factory.mktemp("lerobot_run")
    env = install_plugins(tmp / "site")
    cfg = run_config()
    config = tmp / "arm.yaml"
    config.write_text(yaml.safe_dump(cfg))
    with serving_learner(build_config(cfg), tmp / "run") as learner:
        edge = [str(lerobot_python), "-m", "user_rl.cli", "edge", str(config), "--robot", "arm-l",
                "--learner", learner.addresses["data"], "--weights", learner.addresses["weights"],
                "--spool", str(tmp / "spool")]
        uncalibrated = subprocess.run(edge[:5] + ["robot.options.calibrate=false"] + edge[5:] + ["--max-steps", "1"], env=env,
                                      capture_output=True, text=True, timeout=180, cwd=lerobot_env.REPO)
        done = run_in_lerobot(lerobot_python, *edge[1:], "--max-steps", str(STEPS), env=env, timeout=300)
        status = learner.status()
    calibration = json.loads((tmp / "site" / "calibration" / "robots" / "sim_arm" / "arm_a.json").read_text())
    return {"run": tmp / "run", "output": done.stdout + done.stderr, "uncalibrated": uncalibrated,
            "status": status, "calibration": calibration}


def test_lerobot_robot_plugin_is_driven_by_the_edge_in_a_short_training_run(lerobot_run: dict) -> None:
    refused = lerobot_run["uncalibrated"]
    assert refused.returncode != 0
    assert "is not calibrated: run `lerobot-calibrate --robot.type=sim_arm --robot.id=arm_a`" in refused.stderr
    assert set(lerobot_run["calibration"]) == {"j1", "j2", "j3"}  # calibrate: true ran LeRobot's calibration
    assert f"edge arm-l: detached after {STEPS} steps" in lerobot_run["output"]

    obs_space, action_space = buffer_spaces(lerobot_run["run"] / "buffer")
    assert obs_space["state"].shape == (3,)  # the arm's three joint positions, from LeRobot's features
    # bounds from the motors' calibration: +-1024 of 4095 steps a turn about the middle, in degrees
    np.testing.assert_allclose(action_space.high, [1024 * 360 / 4095] * 3, rtol=1e-6)
    np.testing.assert_allclose(action_space.low, -action_space.high)
    steps = joined(lerobot_run["run"])
    assert len(steps["action"]) == STEPS  # every step arrived, once
    assert steps["obs/state"].shape == (STEPS, 3)
    assert np.ptp(steps["obs/state"], axis=0).min() > 1.0  # the arm moved
    assert (np.abs(steps["action"]) <= action_space.high).all()
    assert all(len(e) <= EPISODE_STEPS for e in episodes(lerobot_run["run"]))  # the time limit ends episodes
    # the learner trained, and the edge acted with its updates
    assert lerobot_run["status"]["updates"] > 0
    assert steps["policy_version"].max() >= 1, lerobot_run["status"]


def test_lerobot_teleoperator_intervention_success_and_rerecord_arrive_in_the_buffer(lerobot_run: dict) -> None:
    steps = joined(lerobot_run["run"])
    person = np.flatnonzero(steps["actor"] == pb.ACTOR_HUMAN)
    np.testing.assert_array_equal(person, np.arange(50, 70))  # the button was held over reads 50-69
    np.testing.assert_array_equal(steps["action"][person], np.tile(PAD_POSE, (20, 1)))  # the pad's action
    assert not np.allclose(steps["policy_action"][person], PAD_POSE)  # and the policy's proposal beside it
    # success at step 100: a person's success label on the episode's last row (reward 1 with reward.type labels)
    labelled = np.flatnonzero(steps["label"] != pb.LABEL_NONE)
    np.testing.assert_array_equal(labelled, [100])
    assert steps["label"][100] == pb.LABEL_SUCCESS and steps["label_by"][100] == pb.LABEL_BY_PERSON
    assert steps["terminated"][100] and steps["reward"][100] == 1.0 and steps["reward"].sum() == 1.0
    # re-record at step 150: that episode ends there (truncated), with the discard mark
    parts = episodes(lerobot_run["run"])
    last_steps = np.cumsum([len(e) for e in parts]) - 1
    assert [(int(end), e.status) for e, end in zip(parts, last_steps) if e.end_reason == "discard"] == [(150, "truncated")]
    assert sum(e.interventions for e in parts) == 20


def episodes(run: Path) -> list[Episode]:
    return sorted(read_episodes(run / "buffer", EpisodeFilter(with_discarded=True)), key=lambda e: e.number)


def joined(run: Path) -> dict[str, np.ndarray]:
    """Every step of the run in order (one robot): each column over all its episodes."""
    parts = episodes(run)
    return {name: np.concatenate([e.steps[name] for e in parts]) for name in parts[0].steps}


def test_hal_discover_lists_lerobot_robot_types_and_installed_plugins(lerobot_python: Path, tmp_path: Path) -> None:
    env = install_plugins(tmp_path / "site")
    done = run_in_lerobot(lerobot_python, "-m", "user_rl.cli", "hal", "discover", "--json", "--sim-slots", "0", env=env)
    listed = {d["name"]: d for d in json.loads(done.stdout)["devices"] if d["kind"] == "lerobot"}
    assert {"so101_follower", "koch_follower", "lekiwi", "sim_arm"} <= set(listed)
    assert listed["sim_arm"]["status"] == "candidate" and listed["sim_arm"]["resource"] is None
