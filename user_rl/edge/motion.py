"""A person's motion command as the robot's action: what every person-driven intervention source
(the teleop page's keys and gamepad) sends, in the terms the robot declared (`ActionMode`).

A motion command gives each action dimension a value in [-1, 1]: which way and how fast (a held
key is +-`teleop.speed`, a stick its deflection). Nothing held (all zero) is "hold still": for a
robot of absolute position goals the pose it was at when the motion stopped (so a take-over never
sends zero goals, and a sagging arm is not followed down), for a relative one (delta, velocity,
effort) zero. A non-zero command moves from the CURRENT pose by at most one step: for an absolute
robot the safety filter's per-step limit (`robots.safety.step_limit`) times the command, for a
relative one the command times half the action's range (+-1 of a [-1, 1] space).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from user_rl.hal.action import ActionMode, zero_motion
from user_rl.robots.safety import step_limit

if TYPE_CHECKING:
    from user_rl.hal.robot import Observation, Robot


class Motion:
    """Turns motion commands into actions for one robot; remembers where a hold started."""

    def __init__(
        self,
        mode: ActionMode,
        low: np.ndarray,
        high: np.ndarray,
        step: np.ndarray | None,
        hold_action: Callable[[Observation], np.ndarray] | None = None,
    ) -> None:
        self.mode = mode
        self.low, self.high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        if mode.absolute and (step is None or hold_action is None):
            raise ValueError("an absolute-position robot's motion needs its per-step limit and its hold_action")
        # how far a full (+-1) command moves in one step
        self.step = np.asarray(step, np.float64) if mode.absolute else (self.high - self.low) / 2.0
        self._hold_action = hold_action
        self._held: np.ndarray | None = None  # the goal kept while nothing is held (absolute robots)
        self._episode = -1

    @classmethod
    def for_robot(cls, robot: Robot, max_action_delta: float | None = None, control_hz: float = 0.0) -> Motion:
        """The robot's declared mode and hold, and the same per-step limit its safety filter uses."""
        space = robot.action_space
        return cls(
            robot.action_mode,
            space.low,
            space.high,
            step_limit(space, max_action_delta, robot, control_hz),
            robot.hold_action,
        )

    def still(self, obs: Observation) -> np.ndarray:
        """Hold still: the robot's current pose (absolute) or zero (relative)."""
        if not self.mode.absolute:
            return zero_motion(self.low, self.high)
        assert self._hold_action is not None
        return np.asarray(self._hold_action(obs), np.float64).reshape(self.low.shape)

    def action(self, command: np.ndarray, obs: Observation, episode: int = 0) -> np.ndarray:
        """This step's action (float32) for a motion command (each value in [-1, 1]) seen at `obs`."""
        command = np.clip(np.asarray(command, np.float64).reshape(self.low.shape), -1.0, 1.0)
        if episode != self._episode:  # a new episode starts from wherever reset left the robot
            self._episode, self._held = episode, None
        if not command.any():
            if self._held is None:
                self._held = self.still(obs)
            return self._held.astype(np.float32)
        self._held = None
        return np.clip(self.still(obs) + command * self.step, self.low, self.high).astype(np.float32)

    def release(self) -> None:
        """Forget the held pose (a take-over or a hand-back): the next hold starts where the robot is."""
        self._held = None
