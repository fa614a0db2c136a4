"""gym-hil (Hugging Face's MuJoCo Panda envs for HIL-SERL) as a third-party robot through the `gym`
driver, in the LeRobot environment: the `hil` extra installs gym-hil there (it pins MuJoCo below 3.9,
the main environment has 4.0, on which its first step fails).

- gym_hil_checks.py: `gym_hil/PandaPickCubeBase-v0` by its plain id (the driver imports gym_hil for
  the namespace) with `image_obs`: flat keys `agent_pos`, `pixels.front`, `pixels.wrist`, 10 Hz from
  the env, and a scripted pick (gym_hil_tasks/hil_scripted.py) lifts the cube: gym-hil's `succeed`,
  named by `success_key`, arrives as `is_success` on the last step only.
- `user-rl train` with the same env and its expert (`hil_scripted/PandaPickCubeScripted-v0`, gym-hil's
  env in a wrapper that offers the expert to the scripted intervener): the expert's demonstration
  episodes count as successes in the learner's stats and the buffer's labels, the buffer holds both
  cameras as `obs/pixels.front` and `obs/pixels.wrist`, DrQ trains on them, and `buffer export` writes
  them as LeRobot cameras `observation.images.pixels.front` / `.wrist`, which LeRobot's loader reads
  and `buffer import` brings back under the run's own keys.

The expert's module turns gym-hil's shadows off (0.5 s of CPU a step on a machine without a GPU,
0.06 s without them): the run takes about a minute of the test's 2 (the rest: Ray, the export).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.lerobot.harness import run_in_lerobot
from tests.support import lerobot_env
from user_rl.cloud.buffer.inspect import inspect_buffer
from user_rl.cloud.buffer.segment import read_segment
from user_rl.extras import LEROBOT_ENV_COMMAND

HERE = Path(__file__).parent
TASKS = HERE / "gym_hil_tasks"  # hil_scripted.py: the module the id's namespace names
CAMERAS = ("pixels.front", "pixels.wrist")
IMAGE = 128  # gym-hil's own render size (GymRenderingSpec)
MAX_STEPS = 300


def hil_env() -> dict[str, str]:
    """The environment the LeRobot env's python runs in: this checkout (and the test's task module)
    first on the path, MuJoCo on EGL, no hub."""
    path = os.pathsep.join(p for p in (str(TASKS), str(lerobot_env.REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "MUJOCO_GL": "egl", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def has_gym_hil(lerobot_python: Path) -> Path:
    """The LeRobot environment's python, once it is known to have gym-hil (the `hil` extra): one built
    before the extra (USER_RL_LEROBOT_PYTHON naming an older one) fails here, saying so."""
    found = subprocess.run(
        [str(lerobot_python), "-c", "import gym_hil"], capture_output=True, text=True, env=hil_env(), timeout=120
    )
    assert found.returncode == 0, (
        f"the LeRobot environment {lerobot_python} has no gym-hil (the hil extra): {LEROBOT_ENV_COMMAND} "
        f"brings it\n{found.stderr[-2000:]}"
    )
    return lerobot_python


def test_gym_hil_pick_cube_by_its_plain_id_with_cameras_and_its_success_flag(has_gym_hil: Path) -> None:
    done = run_in_lerobot(has_gym_hil, str(HERE / "gym_hil_checks.py"), env=hil_env(), timeout=300)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    print({k: found[k] for k in ("mujoco", "steps", "seconds_per_step", "lifted_m")})
    assert tuple(int(n) for n in found["mujoco"].split(".")[:2]) < (3, 9)
    assert not found["gym_hil_imported_first"]  # the driver imported it, for the id's namespace
    image = [[IMAGE, IMAGE, 3], "uint8"]
    assert found["spaces"] == {"agent_pos": [[18], "float32"], "pixels.front": image, "pixels.wrist": image}
    assert found["action"] == [[7], -1.0, 1.0]
    assert found["control_hz"] == 10.0  # gym-hil's render_fps (control_dt 0.1 s)
    assert found["instruction"] == "pick up the cube"
    assert found["reset_keys"] == found["final_keys"] == ["agent_pos", "pixels.front", "pixels.wrist"]
    assert found["final_in_space"] and found["cameras_moved"] == {"pixels.front": True, "pixels.wrist": True}
    # the expert lifted the cube: gym-hil ends the episode, and its `succeed` is the driver's is_success
    assert found["terminated"] and not found["truncated"] and found["steps"] < 100, found
    assert found["info"] == {"succeed": True, "is_success": True} and found["reward"] == 1.0
    assert found["successes_before_the_last"] == 0 and found["lifted_m"] > 0.1
    assert found["state_only_keys"] == ["agent_pos", "environment_state"]
    assert found["default_info"] == {"succeed": False}  # without success_key the edge would count nothing


def test_user_rl_trains_on_gym_hil_cameras_and_counts_the_expert_demonstrations_as_successes(
    has_gym_hil: Path, tmp_path: Path
) -> None:
    config = {
        "name": "gym-hil",
        "seed": 0,
        "robot": {
            "type": "gym",
            "options": {
                "env_id": "hil_scripted/PandaPickCubeScripted-v0",
                "success_key": "succeed",
                "env_kwargs": {"image_obs": True},
            },
        },
        "fleet": {"num_robots": 1, "batch_transitions": 16},
        "policy": {"type": "mlp", "hidden": [32, 32]},
        "algo": {"type": "drq", "batch_size": 8, "learning_starts": 100, "utd_ratio": 0.05},
        "intervention": {"scripted": True, "demo_episodes": 2, "watched_fraction": 0.0},
        "learner": {"publish_every_updates": 2},
        "stop": {"max_env_steps": MAX_STEPS, "max_wall_s": 400, "eval_every_s": None, "eval_episodes": 1},
    }
    (tmp_path / "gym_hil.yaml").write_text(yaml.safe_dump(config))
    run_in_lerobot(
        has_gym_hil,
        "-m",
        "user_rl.cli",
        "train",
        str(tmp_path / "gym_hil.yaml"),
        f"run_root={tmp_path / 'runs'}",
        env=hil_env(),
        timeout=540,
    )
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    learner = summary["learner"]
    robot = learner["robots"]["gym-0"]
    print(f"learner: {learner['env_steps']} env steps, {learner['updates']} updates, robot: {robot}")
    assert learner["env_steps"] == MAX_STEPS and learner["updates"] > 0 and learner["policy_version"] >= 1
    assert robot["episodes"] >= 3 and robot["recent_success"] > 0  # the demonstrations lifted the cube

    report = inspect_buffer(run_dir / "buffer")
    episodes = report["episodes"]
    print("buffer:", episodes, report["success_rate"])
    assert report["ok"] and episodes["labelled"] >= 3 and report["success_rate"] > 0
    segments = sorted((run_dir / "buffer").rglob("seg-*.seg"))
    assert segments
    columns = read_segment(segments[0]).columns
    for camera in CAMERAS:
        frames = np.asarray(columns[f"obs/{camera}"])
        assert frames.dtype == np.uint8 and frames.shape[1:] == (IMAGE, IMAGE, 3)
        assert frames.std() > 5  # a rendered scene, not a blank frame
    assert np.asarray(columns["obs/agent_pos"]).shape[1:] == (18,)

    # the expert's demonstrations as a LeRobot dataset (all 300 frames would take 1.5 minutes of CPU)
    dataset = tmp_path / "dataset"
    export = ("buffer", "export", str(run_dir / "buffer"), str(dataset), "--with-interventions")
    run_in_lerobot(has_gym_hil, "-m", "user_rl.cli", *export, env=hil_env())
    features = json.loads((dataset / "meta" / "info.json").read_text())["features"]
    for camera in CAMERAS:
        assert features[f"observation.images.{camera}"]["shape"] == [IMAGE, IMAGE, 3]
    assert features["observation.state"]["shape"] == [18]
    loaded = run_in_lerobot(
        has_gym_hil,
        "-c",
        "import json, sys; from lerobot.datasets.lerobot_dataset import LeRobotDataset; "
        "d = LeRobotDataset('local/user-rl', root=sys.argv[1]); "
        "print(json.dumps([len(d), *(list(d[0][f'observation.images.{c}'].shape) for c in sys.argv[2:])]))",
        str(dataset),
        *CAMERAS,
        env=hil_env(),
    )
    frames, front, wrist = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert 10 < frames < 100 and front == wrist == [3, IMAGE, IMAGE]  # LeRobot's own loader: channels first
    # and back into a buffer, with the run's own keys
    run_in_lerobot(
        has_gym_hil, "-m", "user_rl.cli", "buffer", "import", str(dataset), str(tmp_path / "demos"), env=hil_env()
    )
    imported = inspect_buffer(tmp_path / "demos")
    assert imported["spaces"] == report["spaces"] and imported["rows"] >= frames, (imported["spaces"], report["spaces"])
