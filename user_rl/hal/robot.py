"""The robot contract: a simulator and a real arm look the same to the edge daemon.

The control loop this interface serves::

    with make_robot("mujoco_reach", robot_id="arm-0") as robot:
        obs = robot.reset(seed=0)
        while True:
            result = robot.step(policy(obs))
            obs = result.observation
            if result.terminated or result.truncated:
                obs = robot.reset()
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from user_rl.hal.action import ActionMode, zero_motion
from user_rl.hal.descriptor import DeviceDescriptor, DeviceKind

Observation = dict[str, np.ndarray]


@dataclass
class StepResult:
    """What one control step returns. `info["is_success"]` is the task's success flag, if any."""

    observation: Observation
    reward: float
    terminated: bool
    truncated: bool
    action_applied: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Health:
    ok: bool
    detail: str = ""


class Robot(abc.ABC):
    """One robot or simulator slot.

    Observations are dicts of arrays (images uint8 HWC); actions are float32 vectors in
    `action_space`. `step` returns the action actually applied (after the driver's own
    clipping) so the transition records what the robot really did. A robot is used from the
    thread that made it: camera and GL contexts are bound to their thread.

    `action_mode` says what an action means (`ActionMode`); `hold_action(obs)` is the action that
    keeps the robot where `obs` shows it. A driver of absolute position goals must implement
    `hold_action` (`make_robot` refuses one that does not): zero is a pose, not "stay".
    """

    device_kind: ClassVar[DeviceKind] = "robot"  # "sim" for simulators: what a scheduler counts it as
    # The meaning of an action. The default, delta, is what zero meant before drivers declared it
    # ("no motion"); a real robot's driver should say (`make_robot` logs one that does not).
    action_mode: ClassVar[ActionMode] = ActionMode.DELTA
    descriptor: DeviceDescriptor
    observation_space: gym.spaces.Dict
    action_space: gym.spaces.Box

    @property
    def control_hz(self) -> float:
        return self.descriptor.control_hz

    @property
    def instruction(self) -> str:
        return self.descriptor.instruction

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> Observation:
        """Start a new episode and return its first observation. The edge also calls it after an
        e-stop is re-armed and after a watchdog hold (those end the episode): a real driver decides
        what starting over means, e.g. return to a start pose, or just read the current state."""

    @abc.abstractmethod
    def step(self, action: np.ndarray) -> StepResult:
        """Send one action, wait for the next observation."""

    def close(self) -> None:  # noqa: B027  (optional: most drivers hold nothing to release)
        """Release the device. Safe to call twice."""

    def health(self) -> Health:
        return Health(ok=True)

    def predict(self, action: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None] | None:
        """Where `action` would take the robot from now: (joint targets in rad, end-effector position
        in m), either may be None; None if the driver cannot tell. The safety filter uses it to keep
        actions inside the descriptor's joint limits and workspace."""
        return None

    def hold_action(self, obs: Observation) -> np.ndarray:
        """The action that keeps the robot where `obs` (its latest observation) shows it: what a
        take-over with nothing held sends, and what the safety filter sends instead of an action it
        refuses. Relative modes: zero (inside the action space). Absolute position goals: the
        driver's current joint positions in action units; such a driver must override this."""
        if self.action_mode.absolute:
            raise NotImplementedError(
                f"{type(self).__qualname__} declares {self.action_mode.value} actions "
                f"but does not implement hold_action(obs)"
            )
        space = self.action_space
        return zero_motion(space.low, space.high).astype(space.dtype)

    def hold(self) -> None:  # noqa: B027  (a sim needs none; make_robot refuses a real robot without one)
        """Stop moving and keep the current pose. Called on an e-stop, and by the watchdog from its
        own thread while the control loop is stalled; the edge never calls it during another call
        to the robot. A real robot's driver must implement it (`make_robot` refuses a
        `device_kind = "robot"` driver that does not); for a sim, which does not move between
        steps, doing nothing is a hold."""

    @classmethod
    def check_holds(cls, name: str) -> None:
        """Refuse a real-robot driver that does not say how it holds (the base hold does nothing),
        and a driver of absolute position goals that does not say what holding still is."""
        where = f"robot driver {name!r} ({cls.__module__}.{cls.__qualname__})"
        if cls.device_kind == "robot" and cls.hold is Robot.hold:
            raise TypeError(
                f"{where} is a real robot "
                f'(device_kind = "robot") but does not implement hold(): the e-stop and the '
                f"watchdog need it to stop the arm and keep its pose"
            )
        if not isinstance(cls.action_mode, ActionMode):
            raise TypeError(
                f"{where}: action_mode must be one of "
                f"{', '.join('ActionMode.' + m.name for m in ActionMode)}, got {cls.action_mode!r}"
            )
        if cls.action_mode.absolute and cls.hold_action is Robot.hold_action:
            raise TypeError(
                f"{where} declares absolute_position actions but does not implement "
                f"hold_action(obs): a take-over with nothing held must send the current pose, "
                f"not zero"
            )

    def __enter__(self) -> Robot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
