"""A LeRobot robot, a LeRobot teleoperator and a LeRobot ACT policy in a short training run.

The devices are plugins defined by the test (tests/lerobot/plugins), installed the way LeRobot
finds third-party devices: a simulated arm whose motor bus is calibrated like an SO arm's, and a
gamepad whose presses follow a script. The policy is an ACT that LeRobot saved to a local
directory (tests/lerobot/save_act.py). `user-rl learner` and `user-rl edge` run in the LeRobot
environment: the edge runs ACT's chunks, the learner fine-tunes it on the pad's interventions
(HG-DAgger) and sends it back; the learner's buffer and checkpoint are the judges of what happened.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.lerobot.harness import install_plugins, run_in_lerobot
from tests.support import lerobot_env
from user_rl.cloud.buffer.episodes import Episode, EpisodeFilter, buffer_spaces, read_episodes
from user_rl.testing.wait import free_port, wait_until
from user_rl.wire import user_rl_pb2 as pb

STEPS = 600
EPISODE_STEPS = 40
PAD_POSE = [30.0, -20.0, 10.0]  # degrees: where the person's pad drives the arm
# Reads of the pad (one per control step): hold the intervention button over reads 50-69, 170-229
# and 280-339, press success at 100 and re-record at 150.
INTERVENTIONS = [[50, 70], [170, 230], [280, 340]]
PAD = {
    "type": "sim_pad",
    "id": "pad",
    "pose": PAD_POSE,
    "intervene": INTERVENTIONS,
    "success": [100],
    "rerecord": [150],
}
CHUNK, ACTION_STEPS = 10, 5  # ACT plans 10 actions; the edge executes 5 of each plan


def run_config(act_dir: Path) -> dict:
    return {
        "robot": {
            "type": "lerobot",
            "options": {
                "robot": {"type": "sim_arm", "id": "arm_a"},
                "control_hz": 200,
                "episode_steps": EPISODE_STEPS,
                "calibrate": True,
            },
        },
        "fleet": {"num_robots": 1, "control_hz": 100, "batch_transitions": 16},
        "policy": {
            "type": "lerobot",
            "chunk": CHUNK,
            "lerobot": {"path": str(act_dir), "n_action_steps": ACTION_STEPS},
        },
        "algo": {"type": "bc", "learning_starts": 32, "batch_size": 32, "actor_lr": 1e-3},
        "reward": {"type": "labels"},
        "intervention": {"teleoperator": PAD},
        # a goal may jump the whole range: the pad's pose is stored as it gave it (by default an
        # absolute arm's goals move at most its range in 2 s: docs/safety.md, tests/edge/test_teleop_takeover.py)
        "safety": {"max_action_delta": 200.0},
        "learner": {
            "data_port": free_port(),
            "weights_port": free_port(),
            "torch_threads": 1,
            "publish_every_updates": 20,
        },
    }


@pytest.fixture(scope="module")
def lerobot_run(lerobot_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`user-rl learner` and `user-rl edge` for the LeRobot arm, in the LeRobot environment, STEPS steps."""
    tmp = tmp_path_factory.mktemp("lerobot_run")
    env = install_plugins(tmp / "site")
    act_dir, run = tmp / "act", tmp / "run"
    cfg = run_config(act_dir)
    config = tmp / "arm.yaml"
    config.write_text(yaml.safe_dump(cfg))
    cli = [str(lerobot_python), "-m", "user_rl.cli"]
    learner_config = cfg["learner"]
    edge = [
        *cli,
        "edge",
        str(config),
        "--robot",
        "arm-l",
        "--learner",
        f"tcp://127.0.0.1:{learner_config['data_port']}",
        "--weights",
        f"tcp://127.0.0.1:{learner_config['weights_port']}",
        "--spool",
        str(tmp / "spool"),
    ]

    def start(*args: str) -> subprocess.Popen:  # the three start at once: each spends seconds importing LeRobot
        return subprocess.Popen(
            list(args), env=env, cwd=lerobot_env.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    # the ACT directory (the learner reads it once the edge says hello), the learner, and an uncalibrated start
    saving = start(str(lerobot_python), str(Path(__file__).parent / "save_act.py"), str(act_dir), "3", str(CHUNK))
    learner = start(*cli, "learner", str(config), "--run-dir", str(run))
    uncalibrated = start(*edge[:5], "robot.options.calibrate=false", *edge[5:], "--max-steps", "1")
    try:
        assert saving.wait(120) == 0, saving.communicate()[0][-3000:]
        wait_until(lambda: (run / "addresses.json").is_file() or learner.poll() is not None, 120, "the learner")
        assert learner.poll() is None, learner.communicate()[0][-3000:]
        refused = uncalibrated.communicate(timeout=180)[0], uncalibrated.returncode
        # A hello without steps: the learner learns the spaces and starts its trainer (LeRobot's ACT takes
        # ~15 s to build on 2 busy cores) before the run, whose 600 steps take 6 s, begins.
        run_in_lerobot(lerobot_python, *edge[1:], "--max-steps", "0", env=env, timeout=300)
        wait_until(
            lambda: json.loads((run / "learner_status.json").read_text()).get("trainer_ready"),
            120,
            "the learner's trainer",
        )
        done = run_in_lerobot(lerobot_python, *edge[1:], "--max-steps", str(STEPS), env=env, timeout=300)
    finally:
        learner.send_signal(signal.SIGINT)
        learner_log = learner.communicate(timeout=120)[0]
    status = json.loads((run / "learner_status.json").read_text())
    assert status.get("stopped") and not status.get("errors"), learner_log[-3000:]
    calibration = json.loads((tmp / "site" / "calibration" / "robots" / "sim_arm" / "arm_a.json").read_text())
    return {
        "run": run,
        "output": done.stdout + done.stderr,
        "uncalibrated": refused,
        "status": status,
        "calibration": calibration,
        "act_dir": act_dir,
        "learner_log": learner_log,
    }


def test_lerobot_robot_plugin_is_driven_by_the_edge_in_a_short_training_run(lerobot_run: dict) -> None:
    refused, returncode = lerobot_run["uncalibrated"]
    assert returncode != 0
    assert "is not calibrated: run `lerobot-calibrate --robot.type=sim_arm --robot.id=arm_a`" in refused
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
    assert lerobot_run["status"]["updates"] > 0, lerobot_run["learner_log"][-3000:]
    assert steps["policy_version"].max() >= 1, lerobot_run["status"]


def test_lerobot_teleoperator_intervention_success_and_rerecord_arrive_in_the_buffer(lerobot_run: dict) -> None:
    steps = joined(lerobot_run["run"])
    person = np.flatnonzero(steps["actor"] == pb.ACTOR_HUMAN)
    held = np.concatenate([np.arange(start, end) for start, end in INTERVENTIONS])
    np.testing.assert_array_equal(person, held)  # the button was held over reads 50-69, 170-229, 280-339
    np.testing.assert_array_equal(steps["action"][person], np.tile(PAD_POSE, (len(held), 1)))  # the pad's action
    assert not np.allclose(steps["policy_action"][50:70], PAD_POSE)  # and the policy's proposal beside it
    # success at step 100: a person's success label on the episode's last row (reward 1 with reward.type labels)
    labelled = np.flatnonzero(steps["label"] != pb.LABEL_NONE)
    np.testing.assert_array_equal(labelled, [100])
    assert steps["label"][100] == pb.LABEL_SUCCESS and steps["label_by"][100] == pb.LABEL_BY_PERSON
    assert steps["terminated"][100] and steps["reward"][100] == 1.0 and steps["reward"].sum() == 1.0
    # re-record at step 150: that episode ends there (truncated), with the discard mark
    parts = episodes(lerobot_run["run"])
    last_steps = np.cumsum([len(e) for e in parts]) - 1
    assert [(int(end), e.status) for e, end in zip(parts, last_steps) if e.end_reason == "discard"] == [
        (150, "truncated")
    ]
    assert sum(e.interventions for e in parts) == len(held)


def test_a_lerobot_act_policy_from_a_local_directory_runs_on_the_edge_and_takes_the_learners_updates(
    lerobot_run: dict,
) -> None:
    steps = joined(lerobot_run["run"])
    policy = steps["actor"] == pb.ACTOR_POLICY
    versions = steps["policy_version"][policy]
    assert policy.sum() > 200 and (np.diff(versions) >= 0).all()
    assert len(set(versions)) >= 3, lerobot_run["status"]  # the edge took several of the learner's updates
    # ACT plans CHUNK actions and the edge runs the first ACTION_STEPS of a plan (from the index the plan
    # arrives at: the next one is inferred while the last one runs), so most steps run a later action of a plan
    chunk_steps = steps["chunk_step"][policy]
    assert chunk_steps.max() < ACTION_STEPS and (chunk_steps > 0).mean() > 0.5
    # the learner fine-tuned LeRobot's ACT from the directory: the same tensors, with its normalisation, moved
    actor = torch.load(lerobot_run["run"] / "checkpoint.pt", weights_only=True)["algo"]["actor"]
    saved = load_file(str(lerobot_run["act_dir"] / "model.safetensors"))
    assert {f"policy.{name}" for name in saved} <= set(actor)
    assert any(not torch.equal(tensor, actor[f"policy.{name}"]) for name, tensor in saved.items())
    np.testing.assert_allclose(actor["observation_state_shift"], [5.0] * 3)  # save_act.py's stats
    np.testing.assert_allclose(actor["observation_state_scale"], [40.0] * 3)
    np.testing.assert_allclose(actor["action_scale"], [45.0] * 3)
    assert lerobot_run["status"]["metrics"]["l1_loss"] >= 0.0  # ACT's own loss, reported by the learner
    # and it does what the person showed: in the run's last 100 steps the policy's actions are the pad's pose
    late = policy & (np.arange(len(policy)) >= STEPS - 100)
    assert late.sum() > 50
    first = np.abs(steps["policy_action"][50:70] - PAD_POSE).mean()
    learned = np.abs(steps["action"][late] - PAD_POSE).mean()
    assert learned < 5.0 < first, (first, learned)


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


def test_user_rl_train_runs_a_lerobot_robot_from_the_environment_the_readme_makes(
    lerobot_python: Path, tmp_path: Path
) -> None:
    """`.venv-lerobot/bin/user-rl train` (the README's LeRobot command made it, as the suite's
    environment is made) places the LeRobot plugin arm on Ray and trains: Ray, MuJoCo-free sims and
    LeRobot in one environment."""
    from user_rl.extras import LEROBOT_ENV_COMMAND

    assert LEROBOT_ENV_COMMAND in (lerobot_env.REPO / "README.md").read_text()
    config = {
        "name": "lerobot-arm",
        "robot": {
            "type": "lerobot",
            "options": {
                "robot": {"type": "sim_arm", "id": "arm_t"},
                "control_hz": 200,
                "episode_steps": 40,
                "calibrate": True,
            },
        },
        "fleet": {"num_robots": 1, "control_hz": 100, "batch_transitions": 16, "pace_to_learner": True},
        "algo": {"type": "sac", "learning_starts": 100, "batch_size": 32, "utd_ratio": 0.25},
        "policy": {"hidden": [32, 32]},
        "learner": {"torch_threads": 1},
        "safety": {"max_action_delta": 200.0},
        "stop": {"max_env_steps": 300, "max_wall_s": 300, "eval_every_s": None, "eval_episodes": 1},
    }
    (tmp_path / "arm.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [str(lerobot_python.parent / "user-rl"), "train", str(tmp_path / "arm.yaml"), f"run_root={tmp_path / 'runs'}"],
        env=install_plugins(tmp_path / "site"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (summary_file,) = (tmp_path / "runs").glob("lerobot-arm-*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["stop_reason"] == "max_env_steps" and summary["learner"]["env_steps"] >= 300
    assert summary["learner"]["buffer"] >= 290  # every step stored (less each episode's last: no successor)
    assert [robot["health"] for robot in summary["learner"]["robots"].values()] == ["ok"]
