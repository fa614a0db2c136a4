"""The action filter every action passes on its way to a robot, sims included, and the
watchdog that holds a robot whose actions stop coming.

In order, an action (from the policy or a person) is:
  1. refused if not finite (NaN / inf): the robot holds still instead (`Robot.hold_action`);
  2. clipped to the action space;
  3. rate limited: no component moves more than `max_action_delta` from the last action sent or,
     for a robot of absolute position goals (`ActionMode.ABSOLUTE_POSITION`), from the current
     pose; such a robot gets a default limit from its action bounds when none is set
     (`step_limit`), so no goal, a person's or the policy's, can jump a joint across its range;
  4. shrunk so that the joint targets it implies stay inside the descriptor's joint limits;
  5. refused (hold still) if the end effector it would reach leaves the descriptor's workspace box.
Steps 4 and 5 need the driver to say where an action leads (`Robot.predict`); drivers that
cannot are filtered by 1-3 only. Every intervention is counted by kind for the heartbeat.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from user_rl.hal.robot import Robot

log = logging.getLogger(__name__)

# An absolute-position robot's default rate limit: a goal may move each joint across its whole
# action range in no less than this, at the control rate (30 Hz when neither the loop nor the
# driver gives one). A LeRobot arm of +-90 degrees at 30 Hz: 3 degrees a step.
FULL_RANGE_S = 2.0
FALLBACK_HZ = 30.0


@dataclass(frozen=True)
class SafetySettings:
    max_action_delta: float | None = None  # per step and component, in action units; None: no rate limit
    deadline_s: float = 0.0  # watchdog: no action for this long means hold; 0: off
    hold_wait_s: float = 0.5  # a hold waits this long for a robot call in progress, then gives up


def step_limit(
    action_space: gym.spaces.Box, max_action_delta: float | None, robot: Robot | None = None, control_hz: float = 0.0
) -> np.ndarray | None:
    """The most each action component may change in one step: `max_action_delta` if set; else, for
    a robot of absolute position goals, its action range / (`FULL_RANGE_S` x the control rate); else
    None (no limit). A person's held key moves an absolute robot by this much a step."""
    low, high = action_space.low.astype(np.float64), action_space.high.astype(np.float64)
    if max_action_delta is not None:
        return np.full(low.shape, float(max_action_delta))
    if robot is None or not robot.action_mode.absolute:
        return None
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise ValueError(
            f"{robot.descriptor.id}: its actions are absolute positions but its action space has "
            f"no finite bounds, so no default rate limit: set safety.max_action_delta"
        )
    hz = control_hz or robot.descriptor.control_hz or FALLBACK_HZ
    return (high - low) / (FULL_RANGE_S * hz)


class ActionFilter:
    def __init__(
        self,
        action_space: gym.spaces.Box,
        settings: SafetySettings | None = None,
        robot: Robot | None = None,
        control_hz: float = 0.0,
    ) -> None:
        """`control_hz`: the loop's rate, for an absolute robot's default rate limit (`step_limit`)."""
        self.low = action_space.low.astype(np.float64)
        self.high = action_space.high.astype(np.float64)
        self.hold = ((self.low + self.high) / 2.0).astype(action_space.dtype)  # without a robot to ask
        self.dtype = action_space.dtype
        self.settings = settings or SafetySettings()
        self.robot = robot
        self.absolute = robot is not None and robot.action_mode.absolute
        self.max_delta = step_limit(action_space, self.settings.max_action_delta, robot, control_hz)
        self.violations: Counter[str] = Counter()
        self._last: np.ndarray | None = None

    def __call__(self, action: np.ndarray, obs: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """The action to send, given the observation it was chosen for (`obs`: an absolute robot's
        current pose, the reference of its rate limit and what it holds still at)."""
        action = np.asarray(action, dtype=np.float64).reshape(self.low.shape)
        if not np.isfinite(action).all():
            return self._refuse("non_finite", obs)
        if (action < self.low).any() or (action > self.high).any():
            self.violations["clipped"] += 1
            action = np.clip(action, self.low, self.high)
        delta = self.max_delta
        reference = self._pose(obs) if self.absolute and obs is not None else self._last
        if delta is not None and reference is not None and (np.abs(action - reference) > delta).any():
            self.violations["rate_limited"] += 1
            action = np.clip(action, reference - delta, reference + delta)
        action = self._within_limits(action, obs)
        if action is None:
            return self._refuse("workspace", obs)
        self._last = action
        return action.astype(self.dtype)

    def _pose(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """An absolute robot's hold-still goal for `obs`: where it is."""
        assert self.robot is not None
        return np.asarray(self.robot.hold_action(obs), np.float64).reshape(self.low.shape)

    def _within_limits(self, action: np.ndarray, obs: dict[str, np.ndarray] | None = None) -> np.ndarray | None:
        """Shrink the action until its joint targets are inside the limits; None if it leaves the workspace."""
        if self.robot is None:
            return action
        descriptor = self.robot.descriptor
        prediction = self.robot.predict(action.astype(self.dtype))
        if prediction is None:
            return action
        joints, effector = prediction
        if descriptor.joint_limits and joints is not None:
            low, high = np.array(descriptor.joint_limits, np.float64).T
            if ((joints < low) | (joints > high)).any():
                self.violations["joint_limit"] += 1
                still = self._pose(obs) if self.absolute and obs is not None else np.zeros_like(action)
                now = self.robot.predict(still.astype(self.dtype))[0]
                # The fraction of each joint's step that stays inside its range (targets move linearly):
                # per action component for joint-space actions, else one factor for the whole action.
                step = joints - now
                room = np.where(step > 0, high - now, np.where(step < 0, low - now, 0.0))
                scale = np.clip(np.divide(room, step, out=np.ones_like(step), where=step != 0), 0.0, 1.0)
                action = still + (action - still) * (scale if scale.shape == action.shape else scale.min())
                joints, effector = self.robot.predict(action.astype(self.dtype))
        if descriptor.workspace and effector is not None:
            low, high = np.array(descriptor.workspace, np.float64).T
            if ((effector < low) | (effector > high)).any():
                return None
        return action

    def _refuse(self, kind: str, obs: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Hold still instead: the robot's own still action for `obs`, else the middle of the range."""
        self.violations[kind] += 1
        hold = (
            np.asarray(self.robot.hold_action(obs), np.float64).reshape(self.low.shape)
            if self.robot is not None and obs is not None
            else self.hold.astype(np.float64)
        )
        self._last = hold
        return hold.astype(self.dtype)


class HoldBlocked(RuntimeError):
    """The robot could not be held: another call to it (a stalled step) did not return in time."""


class Watchdog:
    """Holds the robot when no action reached it within `deadline_s` (a stalled policy, an
    overloaded edge). `due()` whenever the next action is due (after each step or reset), `pause()`
    while the robot is not meant to step; the hold happens once per stall, from this watchdog's own
    thread, through `hold` (the edge's serialised call of the driver's `Robot.hold`), which returns
    False when the hold is no longer needed (the late call returned while the hold waited for it).

    A hold that fails (the driver raises, or `HoldBlocked`) is logged with its cause, counted in
    `failures` and kept in `last_failure`; the watchdog goes on watching."""

    def __init__(
        self, deadline_s: float, hold: Callable[[], bool | None], on_hold: Callable[[], None], name: str = "robot"
    ) -> None:
        self.deadline_s = deadline_s
        self.name = name
        self._hold, self._on_hold = hold, on_hold
        self._last = time.monotonic()
        self._armed = False  # armed by the first `due()`: the robot's first reset may take long
        self._held = False
        self._stop = threading.Event()
        self.holds = 0  # stalls the watchdog acted on (held, or tried to)
        self.failures = 0
        self.last_failure: str | None = None
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        if deadline_s > 0:
            self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def due(self) -> None:
        """The next action is due within the deadline from now."""
        self._last = time.monotonic()
        self._armed, self._held = True, False

    def pause(self) -> None:
        """Not stepping on purpose (waiting for credit, stopped): no action is due."""
        self._armed = False

    def hold_now(self, why: str, hold: Callable[[], bool | None] | None = None) -> bool | None:
        """Hold the robot now (a stall, an e-stop) through `hold` (default: the watchdog's own): True if
        held, None if the hold found itself no longer needed, False if it failed. A failure is logged,
        counted and kept, never raised: whoever asked for the hold must go on (and may ask again)."""
        try:
            return None if (hold or self._hold)() is False else True
        except Exception as exc:  # a driver's hold may raise anything; the caller must survive it
            self.failures += 1
            self.last_failure = f"{why}: {type(exc).__name__}: {exc}"
            log.error(
                "%s: could not hold the robot (%s)",
                self.name,
                self.last_failure,
                exc_info=not isinstance(exc, HoldBlocked),
            )
            return False

    def _run(self) -> None:
        tick = min(0.02, self.deadline_s / 4)
        while not self._stop.wait(tick):
            if self._armed and not self._held and time.monotonic() - self._last > self.deadline_s:
                self._held = True
                held = self.hold_now("watchdog")
                if held is not None:
                    self.holds += 1
                if held:
                    try:
                        self._on_hold()
                    except Exception:  # reporting a hold must never stop the watching
                        log.exception("%s: watchdog: reporting a hold failed", self.name)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(1.0)
