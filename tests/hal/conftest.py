"""The driver package that HAL tests install: examples/user_rl_example_arm, a robot driver that lives
outside user-rl and registers through the `user_rl.robots` entry point (the same package
docs/guides/add-a-robot-driver.md walks through). Its arm is a simulated controller process."""

from __future__ import annotations

import pytest

from tests.support.example_arm import example_arm_env


@pytest.fixture(scope="session")
def arm_driver() -> dict[str, str]:
    """The environment for processes that use the driver: the package installed on its PYTHONPATH."""
    return example_arm_env()
