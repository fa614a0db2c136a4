"""A LeRobot plugin teleoperator for the tests: a gamepad whose presses follow a script."""

from .config_sim_pad import SimPadConfig
from .sim_pad import SimPad

__all__ = ["SimPad", "SimPadConfig"]
