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

Idle drivers: a step on which the driver holds nothing (no key, stick or button: the command moves
no dimension) only holds the robot still, so it is flagged `idle` (the mux records it in the row:
`wire/transitions.IDLE`), as are the steps held for a lost connection. A gripper is the exception
the page makes: its open / close setting is latched (it stays in every command once set), so it
counts as held only while it changes: for the steps the gripper needs to cross its range after a
new setting (a grasp is a demonstration; keeping it closed afterwards is not). A driver who has
commanded no motion for `idle_hand_back_s` (0: never) is handed back: the policy acts from the next
step, and the page is told why (`idle_hand_back`). Like any hand-back it moves nothing by itself:
the policy's first action is inferred from where the robot is, and the safety filter bounds how far
it may go from the current pose in a step (an absolute-position arm never jumps).

Latency: the first step that uses a new command is remembered, and the control loop's step
watcher reports it with the time the action was handed to the robot (`StepRecord.sent_at`),
so the page can show key press -> robot.
"""

from __future__ import annotations

import math
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


@dataclass(frozen=True)
class IdleHandBack:
    """A driver handed back for holding nothing too long: for the page's message."""

    client: str
    person: str
    idle_s: float  # how long they had commanded no motion


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
        idle_hand_back_s: float = 0.0,
        gripper_index: int | None = None,
    ) -> None:
        """`motion`: how commands become this robot's actions (`Motion.for_robot`); default: a
        delta robot over [low, high]. `gripper_index`: the robot's gripper dimension, whose
        setting the page latches."""
        self.low, self.high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self.motion = motion or Motion(ActionMode.DELTA, self.low, self.high, None)
        self.command_timeout_s = command_timeout_s
        self.hand_back_after_s = hand_back_after_s
        self.idle_hand_back_s = idle_hand_back_s
        self._moving = np.ones(action_shape, bool)  # the dimensions whose command is motion (not a latched setting)
        self._gripper_steps = 0  # steps a new gripper setting counts as held: the gripper's whole range
        if gripper_index is not None:
            self._moving[gripper_index] = False
            span = float(self.motion.high[gripper_index] - self.motion.low[gripper_index])
            step = float(self.motion.step[gripper_index])
            self._gripper_steps = math.ceil(span / step) if step > 0 and math.isfinite(span) else 1
        self._gripper = gripper_index
        self._active_at = 0.0  # time.monotonic() the driver last commanded motion (or took over)
        self._gripper_left = 0  # steps a new gripper setting still counts as held
        self.idle = False  # the last `act` only held the robot still: its driver held nothing
        self.person = ""  # the name of the driver whose action the last `act` returned (the row's person)
        self._idle_hand_back: IdleHandBack | None = None  # not yet told to the page
        self._idled: str | None = None  # the client handed back for idling, until anyone takes over
        self.idle_hand_backs = 0
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
    def engaged(self) -> bool:
        """Someone has taken over (and has not handed back): the loop is theirs from its next step."""
        return self._driver is not None

    @property
    def holding(self) -> float | None:
        """Seconds left holding still for a driver whose connection dropped, None when not holding."""
        lost_at = self._lost_at
        return None if lost_at is None else max(0.0, self.hand_back_after_s - (time.monotonic() - lost_at))

    @property
    def idle_s(self) -> float | None:
        """Seconds the driver has commanded no motion (None: nobody drives, moving, or their connection is lost)."""
        with self._lock:
            if self._driver is None or self._lost_at is not None or self._moves(self._action):
                return None
            return time.monotonic() - self._active_at

    def take_over(self, client: str, person: str) -> None:
        with self._lock:
            if self._driver not in (None, client) and self._lost_at is None:  # a held robot is free to take
                raise NotYourTurn(f"{self._person} is driving; wait until they hand back")
            self._driver, self._person, self._lost_at, self._idled = client, person, None, None
            self._set(self._zero, -1, time.time())
            self.motion.release()
            self._last_used, self._pending = -1, None
            self._active_at, self._gripper_left = time.monotonic(), 0  # taking over counts as acting

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
                if client == self._idled:  # a refresh its page sent before it knew: an error would hide why
                    return
                raise NotYourTurn(f"{self._person} is driving" if self._driver else "take over before you drive")
            now = time.monotonic()
            if command_id == self._command_id:
                self._refreshed = now
                if self._moves(self._action):  # a held key, refreshed
                    self._active_at = now
                return
            values = np.clip(values, -1.0, 1.0)
            g = self._gripper
            if g is not None and values[g] != self._action[g]:  # a new gripper setting: it moves now
                self._gripper_left, self._active_at = self._gripper_steps, now
            if self._moves(values):
                self._active_at = now
            self._set(values, command_id, time.time())

    def _moves(self, command: np.ndarray) -> bool:
        """Whether a command moves the robot (a latched gripper setting alone does not)."""
        return bool(command[self._moving].any())

    def _set(self, action: np.ndarray, command_id: int, received_at: float) -> None:
        self._action, self._command_id, self._received_at = action, command_id, received_at
        self._refreshed = time.monotonic()

    # -- on the control loop's thread ----------------------------------------------------------
    def act(self, view: StepView) -> np.ndarray | None:
        with self._lock:
            self.idle, self.person = False, self._person
            if self._driver is None:
                return None
            now = time.monotonic()
            if self._lost_at is not None:  # the driver's page lost its connection
                if now - self._lost_at < self.hand_back_after_s:
                    self.idle = True  # nobody holds anything
                    return self._still(view)
                self._driver, self._person, self._lost_at = None, "", None
                self.motion.release()
                return None  # held long enough: the policy acts again
            if self._command_id >= 0 and now - self._refreshed > self.command_timeout_s:
                if self._action is not self._zero:
                    self.stale_commands += 1
                self._action = self._zero  # stale: hold still; the next command moves again
            moving = self._moves(self._action)
            if not moving and 0 < self.idle_hand_back_s <= now - self._active_at:
                return self._hand_back_idle(now)
            if self._command_id >= 0 and self._command_id != self._last_used:
                self._last_used = self._command_id
                self._pending = (self._driver, self._command_id, self._received_at)
            gripping = self._gripper_left > 0 and bool(self._action[self._gripper])
            self._gripper_left = max(0, self._gripper_left - 1)
            self.idle = not moving and not gripping
            return self.motion.action(self._action, view.obs, view.episode)

    def _hand_back_idle(self, now: float) -> None:
        """The driver commanded nothing for `idle_hand_back_s`: the policy acts from this step on."""
        assert self._driver is not None
        self._idle_hand_back = IdleHandBack(self._driver, self._person, now - self._active_at)
        self._idled = self._driver
        self.idle_hand_backs += 1
        self._driver, self._person = None, ""
        self._set(self._zero, -1, time.time())
        self.motion.release()
        return None

    def took_back(self) -> IdleHandBack | None:
        """An idle driver's hand-back not yet told to their page (once)."""
        with self._lock:
            handed, self._idle_hand_back = self._idle_hand_back, None
            return handed

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
