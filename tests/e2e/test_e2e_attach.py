"""`user-rl train` with an attached buffer of other spaces stops at once and says what differs, not
with Ray's traceback (issue 32: an import attached to the wrong run). A real launch: Ray, the learner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.config import BufferConfig

REPO = Path(__file__).resolve().parents[2]


def test_an_attached_buffer_of_other_spaces_stops_the_run_saying_what_differs(tmp_path: Path) -> None:
    other = gym.spaces.Dict({"joints": gym.spaces.Box(-2.0, 2.0, (2,), np.float32)})
    PersistentReplay(tmp_path / "other", other, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), BufferConfig()).close()
    done = subprocess.run(
        [sys.executable, "-m", "user_rl.cli", "train", str(REPO / "configs" / "reach.yaml")]
        + [f"run_root={tmp_path / 'runs'}", f"buffer.attach=[{{path: {tmp_path / 'other'}, source: demo}}]"]
        + ["stop.max_env_steps=200", "fleet.num_robots=1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "MUJOCO_GL": "egl"},
    )
    said = done.stderr.splitlines()
    assert done.returncode == 1, done.stderr[-3000:]
    assert any(line.startswith("user-rl: the learner could not start: ValueError: buffer.attach:") for line in said)
    assert "observation 'joints' is there and not here; observation 'state' is here and not there" in done.stderr
    assert "the action is float32[2] there and float32[3] here" in done.stderr
    assert "Traceback" not in done.stderr
