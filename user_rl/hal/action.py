"""What a robot's action means, declared by its driver, so that everything that acts for a
person (the teleop page, a gamepad, a LeRobot teleoperator) and the safety filter know what
"hold still" and "a small step" are for that robot.

    absolute_position  the action is where the joints should go (a LeRobot arm's `<motor>.pos`):
                       hold still = the current pose; zero is a pose like any other
    delta              the action is a step from the current pose (the reach arm): hold still = zero
    velocity           the action is a speed: hold still = zero
    effort             the action is a force or torque (most Gymnasium tasks): zero = no push
"""

from __future__ import annotations

from enum import Enum

import numpy as np


class ActionMode(str, Enum):
    ABSOLUTE_POSITION = "absolute_position"
    DELTA = "delta"
    VELOCITY = "velocity"
    EFFORT = "effort"

    @property
    def absolute(self) -> bool:
        """Whether zero is a place rather than "no motion": a take-over must then send the current pose."""
        return self is ActionMode.ABSOLUTE_POSITION


def zero_motion(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The still action of a relative (delta, velocity, effort) robot: zero, inside the action space."""
    return np.clip(np.zeros_like(low), low, high)
