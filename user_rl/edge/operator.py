"""What a person asks of a robot's control loop from another thread (the teleop page), and what
the loop tells watchers after each step.

A label counts on an episode's last row, so marking success or failure ends the episode there:
success as terminated (the task is done: nothing to bootstrap from), failure as truncated. A
reset ends the episode in progress (stored as truncated, `end_reason` "reset") and starts a new
one. A discard ends it the same way with `end_reason` "discard" (LeRobot's re-record: the
episode went wrong in a way that is not the policy's doing), which the buffer keeps as a mark.
The loop takes requests between steps, never during one.

A mark or reset from another thread names the episode (and step) it was made in: the loop
applies it only to that episode, and refuses one whose episode has already ended (logged, and
told to whoever asked through `done`), so a mark clicked as an episode ends never labels or cuts
the next one. Sources on the loop's own thread may leave the episode out (the one in progress).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import DISCARD

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepRecord:
    """One step, as the loop saw it (for watchers such as the teleop page)."""

    obs: dict[str, np.ndarray]  # the observation after the step
    action: np.ndarray  # what the robot was sent (after the safety filter)
    proposal: np.ndarray  # what the policy proposed
    actor: int  # pb.Actor: who chose the action
    reward: float
    episode: int
    step: int  # within the episode, 0-based (this step's index)
    policy_version: int
    ended: bool
    label: int  # pb.Label on this row
    sent_at: float  # time.time() when the action was handed to the robot
    idle: bool = False  # a person drove and held nothing (the row's `idle` flag)
    person: str = ""  # the name of the person who acted ("": nobody; the row's `actor_person`)


Done = Callable[[bool, str], None]  # (applied, what happened): told on the loop's thread


@dataclass(frozen=True)
class Request:
    """One mark or reset, with the episode and step it was made in (None: whatever is in progress)."""

    value: int | str  # pb.Label of a mark; the end reason of a reset
    episode: int | None = None
    step: int | None = None
    by: str = ""
    done: Done | None = None

    def answer(self, applied: bool, message: str) -> None:
        if not applied:
            log.warning("%s", message)
        if self.done is not None:
            try:
                self.done(applied, message)
            except Exception:  # telling a page must never stop the loop
                log.exception("telling %s about their request failed", self.by or "someone")


class OperatorRequests:
    """Requests from people, taken by the control loop between steps (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._label: Request | None = None
        self._reset: Request | None = None
        self.refused = 0  # marks and resets refused because their episode had ended

    def mark(
        self, success: bool, episode: int | None = None, step: int | None = None, by: str = "", done: Done | None = None
    ) -> None:
        """Label `episode` (None: the one in progress); its next step is its last."""
        with self._lock:
            self._label = Request(pb.LABEL_SUCCESS if success else pb.LABEL_FAILURE, episode, step, by, done)

    def reset(
        self, episode: int | None = None, step: int | None = None, by: str = "", done: Done | None = None
    ) -> None:
        """End `episode` (None: the one in progress) and start a new one."""
        with self._lock:
            if self._reset is None:
                self._reset = Request("reset", episode, step, by, done)

    def discard(
        self, episode: int | None = None, step: int | None = None, by: str = "", done: Done | None = None
    ) -> None:
        """End `episode` (None: the one in progress), marked as one to leave out, and start a new one."""
        with self._lock:
            self._reset = Request(DISCARD, episode, step, by, done)

    def take_label(self, episode: int | None = None, step: int | None = None) -> int:
        """The label asked for `episode` (the one in progress, now at `step`), else LABEL_NONE; a
        label asked for an episode that has ended is refused."""
        return self.take_mark(episode, step)[0]

    def take_mark(self, episode: int | None = None, step: int | None = None) -> tuple[int, str]:
        """`take_label`, and who asked for it (the mark's `by`: the row's `label_person`; "" with none)."""
        with self._lock:
            request, self._label = self._label, None
        if request is None:
            return pb.LABEL_NONE, ""
        what = pb.Label.Name(int(request.value)).removeprefix("LABEL_").lower()
        if not self._for(request, episode, "mark", what):
            return pb.LABEL_NONE, ""
        request.answer(True, f"episode {episode} marked {what} at its step {step}")
        return int(request.value), request.by

    def take_reset(self, episode: int | None = None) -> str:
        """The end reason of the reset asked for `episode` since the last call ("reset" / "discard"), or ""."""
        with self._lock:
            request, self._reset = self._reset, None
        if request is None or not self._for(request, episode, "reset", str(request.value)):
            return ""
        request.answer(True, f"episode {episode} ended ({request.value})")
        return str(request.value)

    def _for(self, request: Request, episode: int | None, kind: str, what: str) -> bool:
        """Whether `request` is for `episode` (the one in progress); if not, it is refused and told so."""
        if request.episode is None or episode is None or request.episode == episode:
            return True
        self.refused += 1
        at = f" at its step {request.step}" if request.step is not None else ""
        request.answer(
            False,
            f"{kind} refused: {what} {request.by + ' ' if request.by else ''}asked for episode "
            f"{request.episode}{at}, which had already ended (episode {episode} is in progress); "
            + ("nothing was labelled" if kind == "mark" else "the episode in progress goes on"),
        )
        return False
