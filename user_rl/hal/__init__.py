"""Hardware abstraction layer: the device model every robot and simulator implements."""

from user_rl.hal.action import ActionMode
from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.hal.registry import make_robot, register_robot, robot_factory, robot_names
from user_rl.hal.robot import Health, Robot, StepResult

__all__ = [
    "ActionMode",
    "DeviceDescriptor",
    "Health",
    "Robot",
    "StepResult",
    "make_robot",
    "register_robot",
    "robot_factory",
    "robot_names",
]
