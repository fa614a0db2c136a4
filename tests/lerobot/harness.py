"""Running code in the LeRobot tests' environment (tests/support/lerobot_env.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from tests.support import lerobot_env


def run_in_lerobot(
    python: Path, *args: str, timeout: float = 600, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """Run `python args...` in the LeRobot environment; unless told not to `check`, fail the test
    with its output if it fails."""
    done = subprocess.run(
        [str(python), *args], capture_output=True, text=True, timeout=timeout, cwd=lerobot_env.REPO, env=env
    )
    assert not check or done.returncode == 0, f"{' '.join(args)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def user_rl_in_lerobot(python: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`user-rl args` run in the LeRobot environment."""
    return run_in_lerobot(python, "-m", "user_rl.cli", *args, check=check)


PLUGINS = Path(__file__).parent / "plugins"


def install_plugins(site: Path) -> dict[str, str]:
    """Put the test's LeRobot plugins on a path with their dist-info, as `pip install` would, and
    return the environment that finds them (and keeps LeRobot's calibration files under `site`)."""
    for package in sorted(PLUGINS.glob("lerobot_*")):
        shutil.copytree(package, site / package.name, ignore=shutil.ignore_patterns("__pycache__"))
        info = site / f"{package.name}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package.name}\nVersion: 0.1\n")
    return {
        **os.environ,
        "PYTHONPATH": str(site),
        "HF_LEROBOT_CALIBRATION": str(site / "calibration"),
        "HF_LEROBOT_HOME": str(site / "lerobot-home"),
    }


# A dataset as `lerobot-record` writes one for an SO-101-like arm with a camera `front`: LeRobot's own
# feature helpers, `LeRobotDataset.create`, `add_frame`, `save_episode` and `finalize`; cameras as PNG
# frames or, as lerobot-record does by default, as video. It saves what it recorded for the test.
RECORD_WITH_LEROBOT = """
import json, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.datasets.utils import hw_to_dataset_features
root, saved, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
images, video = np.load(spec["images"]), spec["video"]
motors = {f"{m}.pos": float for m in spec["joints"]}
features = {**hw_to_dataset_features({**motors, "front": images.shape[1:]}, "observation", use_video=video),
            **hw_to_dataset_features(motors, "action", use_video=video)}
if spec["text"]:  # a feature a buffer cannot hold
    features["observation.language"] = {"dtype": "string", "shape": (1,), "names": None}
dataset = LeRobotDataset.create("local/so101-record", fps=30, features=features, root=root,
                                robot_type="so101_follower", use_videos=video, encoder_threads=1)
rng = np.random.default_rng(0)
recorded = {"state": [], "front": [], "action": []}
frames = iter(images)
for length, task in spec["episodes"]:
    for _ in range(length):
        frame = {"observation.state": rng.uniform(-90, 90, len(motors)).astype(np.float32),
                 "observation.images.front": next(frames),
                 "action": rng.uniform(-90, 90, len(motors)).astype(np.float32), "task": task}
        if spec["text"]:
            frame["observation.language"] = "the red one"
        dataset.add_frame(frame)
        for key, name in (("state", "observation.state"), ("front", "observation.images.front"), ("action", "action")):
            recorded[key].append(frame[name])
    dataset.save_episode()
dataset.finalize()
np.savez(saved, **{key: np.stack(values) for key, values in recorded.items()})
"""


def record_with_lerobot(
    python: Path,
    root: Path,
    images: np.ndarray,
    episodes: list[tuple[int, str]],
    joints: tuple[str, ...],
    video: bool = False,
    text: bool = False,
) -> dict[str, np.ndarray]:
    """Record `episodes` (length, task) of the camera `images` with LeRobot's own API at `root`; what
    it recorded (state, front, action), frame by frame."""
    images_file, saved = root.with_name(root.name + "-images.npy"), root.with_name(root.name + "-recorded.npz")
    np.save(images_file, images)
    spec = {"images": str(images_file), "video": video, "episodes": episodes, "joints": joints, "text": text}
    run_in_lerobot(python, "-c", RECORD_WITH_LEROBOT, str(root), str(saved), json.dumps(spec))
    return dict(np.load(saved))
