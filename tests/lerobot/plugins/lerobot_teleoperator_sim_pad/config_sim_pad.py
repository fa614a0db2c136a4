from dataclasses import dataclass, field

from lerobot.teleoperators.config import TeleoperatorConfig


@TeleoperatorConfig.register_subclass("sim_pad")
@dataclass
class SimPadConfig(TeleoperatorConfig):
    joints: int = 3
    pose: list[float] = field(default_factory=lambda: [30.0, -20.0, 10.0])  # where the person drives the arm
    path: list[list[float]] = field(default_factory=list)  # else: the pose of each read of the action, in turn
    # Reads of the events (one per control step while the pad is asked) at which each is pressed:
    # the intervention button is held over [start, stop) ranges; the others are pressed for one read.
    intervene: list[list[int]] = field(default_factory=list)
    success: list[int] = field(default_factory=list)
    rerecord: list[int] = field(default_factory=list)
