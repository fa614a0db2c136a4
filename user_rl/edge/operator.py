"""What a person asks of a robot's control loop from another thread (the teleop page), and what
the loop tells watchers after each step.

A label counts on an episode's last row, so marking success or failure ends the episode there:
success as terminated (the task is done: nothing to bootstrap from), failure as truncated. A
reset ends the episode in progress (stored as truncated, `end_reason` "reset") and starts a new
one. A discard ends it the same way with `end_reason` "discard" (LeRobot's re-record: the
episode went wrong in a way that is not the policy's doing), which the buffer keeps as a mark.
The loop takes requests between steps, never during one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import DISCARD


@dataclass(frozen=True)
class StepRecord:
    """One step, as the loop saw it (for watchers such as the teleop page)."""

    obs: dict[str, np.ndarray]  # the observation after the step
    action: np.ndarray          # what the robot was sent (after the safety filter)
    proposal: np.ndarray        # what the policy proposed
    actor: int                  # pb.Actor: who chose the action
    reward: float
    episode: int
    step: int                   # within the episode, 0-based (this step's index)
    policy_version: int
    ended: bool
    label: int                  # pb.Label on this row
    sent_at: float              # time.time() when the action was handed to the robot


class OperatorRequests:
    """Requests from people, taken by the control loop between steps (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._label: int = pb.LABEL_NONE
        self._reset = ""  # the end reason of a reset asked for, "" for none

    def mark(self, success: bool) -> None:
        """Label the episode in progress (its next step is its last)."""
        with self._lock:
            self._label = pb.LABEL_SUCCESS if success else pb.LABEL_FAILURE

    def reset(self) -> None:
        """End the episode in progress and start a new one."""
        with self._lock:
            self._reset = self._reset or "reset"

    def discard(self) -> None:
        """End the episode in progress, marked as one to leave out, and start a new one."""
        with self._lock:
            self._reset = DISCARD

    def take_label(self) -> int:
        with self._lock:
            label, self._label = self._label, pb.LABEL_NONE
            return label

    def take_reset(self) -> str:
        """The end reason of the reset asked for since the last call ("reset" / "discard"), or ""."""
        with self._lock:
            reset, self._reset = self._reset, ""
            return reset
