from dataclasses import dataclass

from lerobot.robots.config import RobotConfig


@RobotConfig.register_subclass("sim_arm")
@dataclass
class SimArmConfig(RobotConfig):
    joints: int = 3
    camera: int = 0  # pixels on a side of a "wrist" camera; 0: none
    max_step_deg: float = 10.0  # the servos reach at most this far towards a goal per command
    log: str = ""  # a file: one JSON line per command (time, goal, position before it), for the tests to read
    stall_after: int = -1  # commands answered before the bus stops answering (hangs for a minute); -1: never
