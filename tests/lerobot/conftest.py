"""The LeRobot tests run LeRobot in its own environment (LeRobot 0.4 pins torch below the suite's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import lerobot_env


@pytest.fixture(scope="session")
def lerobot_python() -> Path:
    """The python of the LeRobot environment (waits for the build the session started)."""
    return lerobot_env.wait()
