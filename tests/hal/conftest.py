"""The toy driver package that HAL tests install: a robot driver that lives outside this
repository and registers through the `user_rl.robots` entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

TOY_PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "toy-arm-driver"
version = "0.1.0"

[project.entry-points."user_rl.robots"]
toy_arm = "toy_arm:ToyArm"
"""

TOY_MODULE = '''
"""A two-joint toy arm on a "serial port" (any file): it reads the port to connect, like a real driver."""
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from user_rl.hal import DeviceDescriptor, Robot, StepResult


class ToyArm(Robot):
    device_kind = "robot"

    def __init__(self, *, port: str, robot_id: str = "toy-0", seed: int | None = None, episode_steps: int = 20,
                 hang_robot: str = "", hang_after: int = 0, rate_hz: float = 0.0):
        """`rate_hz` > 0: each step waits for the arm's next control tick, as a real controller does."""
        self.port = Path(port)
        self.period = 1.0 / rate_hz if rate_hz > 0 else 0.0
        self.next_tick = time.monotonic()
        self.holds = 0
        self.hangs_at = hang_after if robot_id == hang_robot else None  # a cable pulled mid-run
        self.steps = 0
        self.firmware = self.port.read_text().strip()  # a missing port raises: the probe reports it
        self.descriptor = DeviceDescriptor(kind="robot", model="toy_arm", id=robot_id, control_hz=rate_hz or 50.0,
                                           instruction="hold the joints at zero", extra={"firmware": self.firmware})
        self.observation_space = gym.spaces.Dict({"joints": gym.spaces.Box(-3.0, 3.0, (2,), np.float32)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.rng = np.random.default_rng(seed)
        self.episode_steps = episode_steps
        self.joints = np.zeros(2, np.float32)
        self.t = 0

    def reset(self, seed=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.joints = self.rng.uniform(-1, 1, 2).astype(np.float32)
        self.t = 0
        return {"joints": self.joints.copy()}

    def step(self, action):
        self.steps += 1
        if self.hangs_at is not None and self.steps > self.hangs_at:
            time.sleep(3600)  # the robot no longer answers
        if self.period:
            self.next_tick = max(self.next_tick + self.period, time.monotonic() - self.period)
            time.sleep(max(0.0, self.next_tick - time.monotonic()))
        applied = np.clip(action, -1, 1).astype(np.float32)
        self.joints = np.clip(self.joints + 0.1 * applied, -3, 3).astype(np.float32)
        self.t += 1
        return StepResult({"joints": self.joints.copy()}, -float(np.abs(self.joints).sum()), False,
                          self.t >= self.episode_steps, applied)

    def hold(self):
        self.holds += 1  # the servos keep the joints where they are (they move only when stepped)
'''


@pytest.fixture(scope="session")
def toy_driver(tmp_path_factory) -> dict[str, str]:
    """Install the toy driver package (not this repository) into its own directory on PYTHONPATH."""
    root = tmp_path_factory.mktemp("toy")
    src, site = root / "src", root / "site"
    src.mkdir()
    (src / "pyproject.toml").write_text(TOY_PYPROJECT)
    (src / "toy_arm.py").write_text(textwrap.dedent(TOY_MODULE))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True, capture_output=True, timeout=300)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "MUJOCO_GL": "egl"}
