"""A LeRobot plugin robot for the tests: imported by LeRobot's plugin scan, it registers `sim_arm`."""

from .config_sim_arm import SimArmConfig
from .sim_arm import SimArm

__all__ = ["SimArm", "SimArmConfig"]
