from dataclasses import dataclass

from lerobot.robots.config import RobotConfig


@RobotConfig.register_subclass("sim_arm")
@dataclass
class SimArmConfig(RobotConfig):
    joints: int = 3
    camera: int = 0  # pixels on a side of a "wrist" camera; 0: none
    max_step_deg: float = 10.0  # the servos reach at most this far towards a goal per command
