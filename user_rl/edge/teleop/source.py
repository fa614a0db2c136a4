"""The teleop page as an intervention source: the person who took over drives, with the action
their held keys (or gamepad) command; nobody else can drive until they hand back.

The page sends a command (a numbered motion command: each action dimension in [-1, 1], a held key
+-`teleop.speed`, a stick its deflection) whenever the keys held change, and again every fraction of
`command_timeout_s` while any is held. The source turns it into the robot's action each step, in
the terms the robot declared (`edge/motion.py`): nothing held holds still (an absolute-position arm
keeps its current pose, never goes to zero), a held key moves from the current pose by a bounded
step. A command not refreshed for `command_timeout_s` (a page that froze, a lost link) holds still
rather than let the robot run on. A driver whose connection drops does not hand back: the robot
holds still (`_still`) for `hand_back_after_s`, so that a person who reconnects (or anyone else)
can take over again where it stopped; only then does the policy act again.

Latency: the first step that uses a new command is remembered, and the control loop's step
watcher reports it with the time the action was handed to the robot (`StepRecord.sent_at`),
so the page can show key press -> robot.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from user_rl.edge.intervention import StepView
from user_rl.edge.motion import Motion
from user_rl.edge.operator import StepRecord
from user_rl.hal.action import ActionMode
from user_rl.wire import user_rl_pb2 as pb


class NotYourTurn(RuntimeError):
    """Someone else drives (the message says who)."""


@dataclass(frozen=True)
class AppliedCommand:
    """A command's first step on the robot: for the driver's latency display."""

    client: str
    command_id: int
    received_at: float  # time.time() when the server got it
    sent_at: float  # time.time() when the loop handed the action to the robot
    episode: int
    step: int


class WebTeleop:
    """An `InterventionSource` driven by one person at a time from the teleop page."""

    actor = pb.ACTOR_HUMAN

    def __init__(
        self,
        action_shape: tuple[int, ...],
        low: np.ndarray,
        high: np.ndarray,
        command_timeout_s: float = 0.5,
        motion: Motion | None = None,
        hand_back_after_s: float = 10.0,
    ) -> None:
        """`motion`: how commands become this robot's actions (`Motion.for_robot`); default: a
        delta robot over [low, high]."""
        self.low, self.high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self.motion = motion or Motion(ActionMode.DELTA, self.low, self.high, None)
        self.command_timeout_s = command_timeout_s
        self.hand_back_after_s = hand_back_after_s
        self._lost_at: float | None = None  # time.monotonic() the driver's connection dropped
        self._zero = np.zeros(action_shape, np.float32)  # the motion command "nothing held"
        self._lock = threading.Lock()
        self._driver: str | None = None  # the driving client's id
        self._person = ""  # and the name it gave
        self._action = self._zero
        self._command_id = -1
        self._received_at = 0.0  # time.time() of the current command
        self._refreshed = 0.0  # time.monotonic() the current command was last sent
        self._last_used = -1  # the newest command a step used
        self._pending: tuple[str, int, float] | None = None  # its first step, not yet reported
        self.stale_commands = 0  # commands that timed out (the robot was stopped instead)

    @property
    def name(self) -> str:
        """What the mux records and shows as the driver: the person's name."""
        person = self._person
        return f"teleop:{person}" if person else "teleop"

    @property
    def driver(self) -> tuple[str | None, str]:
        """(client id, person's name) of whoever drives, (None, "") when nobody does."""
        with self._lock:
            return self._driver, self._person

    @property
    def holding(self) -> float | None:
        """Seconds left holding still for a driver whose connection dropped, None when not holding."""
        lost_at = self._lost_at
        return None if lost_at is None else max(0.0, self.hand_back_after_s - (time.monotonic() - lost_at))

    def take_over(self, client: str, person: str) -> None:
        with self._lock:
            if self._driver not in (None, client) and self._lost_at is None:  # a held robot is free to take
                raise NotYourTurn(f"{self._person} is driving; wait until they hand back")
            self._driver, self._person, self._lost_at = client, person, None
            self._set(self._zero, -1, time.time())
            self.motion.release()
            self._last_used, self._pending = -1, None

    def hand_back(self, client: str) -> bool:
        """The client stops driving (False if it was not driving)."""
        with self._lock:
            if self._driver != client:
                return False
            self._driver, self._person, self._lost_at = None, "", None
            self._set(self._zero, -1, time.time())
            self.motion.release()
            return True

    def lost(self, client: str) -> bool:
        """The client's connection dropped: if it drove, the robot holds still for `hand_back_after_s`
        (False if it was not driving)."""
        with self._lock:
            if self._driver != client or self._lost_at is not None:
                return False
            self._lost_at = time.monotonic()
            return True

    def command(self, client: str, command_id: int, action: list[float]) -> None:
        """The driver's motion command from now on, each value in [-1, 1] (clipped); a repeat of the
        current id only keeps it alive."""
        values = np.asarray(action, np.float32)
        if values.shape != self._zero.shape or not np.isfinite(values).all():
            raise ValueError(f"a command must be {self._zero.shape[0]} finite numbers, got {action!r}")
        with self._lock:
            if self._driver != client:
                raise NotYourTurn(f"{self._person} is driving" if self._driver else "take over before you drive")
            if command_id == self._command_id:
                self._refreshed = time.monotonic()
                return
            self._set(np.clip(values, -1.0, 1.0), command_id, time.time())

    def _set(self, action: np.ndarray, command_id: int, received_at: float) -> None:
        self._action, self._command_id, self._received_at = action, command_id, received_at
        self._refreshed = time.monotonic()

    # -- on the control loop's thread ----------------------------------------------------------
    def act(self, view: StepView) -> np.ndarray | None:
        with self._lock:
            if self._driver is None:
                return None
            if self._lost_at is not None:  # the driver's page lost its connection
                if time.monotonic() - self._lost_at < self.hand_back_after_s:
                    return self._still(view)
                self._driver, self._person, self._lost_at = None, "", None
                self.motion.release()
                return None  # held long enough: the policy acts again
            if self._command_id >= 0 and time.monotonic() - self._refreshed > self.command_timeout_s:
                if self._action is not self._zero:
                    self.stale_commands += 1
                self._action = self._zero  # stale: hold still; the next command moves again
            if self._command_id >= 0 and self._command_id != self._last_used:
                self._last_used = self._command_id
                self._pending = (self._driver, self._command_id, self._received_at)
            return self.motion.action(self._action, view.obs, view.episode)

    def _still(self, view: StepView) -> np.ndarray:
        """The action that holds the robot still where it is (what "nothing held" commands)."""
        return self.motion.action(self._zero, view.obs, view.episode)

    def applied(self, record: StepRecord) -> AppliedCommand | None:
        """After a step: the command it used first, if any (None for later steps of the same command)."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None or record.actor != self.actor:
                return None
        client, command_id, received_at = pending
        return AppliedCommand(client, command_id, received_at, record.sent_at, record.episode, record.step)
