"""What a person asks of a robot's control loop from another thread (the teleop page), and what
the loop tells watchers after each step.

A label counts on an episode's last row, so marking success or failure ends the episode there:
success as terminated (the task is done: nothing to bootstrap from), failure as truncated. A
reset ends the episode in progress (stored as truncated, `end_reason` "reset") and starts a new
one. The loop takes requests between steps, never during one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from user_rl.wire import user_rl_pb2 as pb


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
        self._reset = False

    def mark(self, success: bool) -> None:
        """Label the episode in progress (its next step is its last)."""
        with self._lock:
            self._label = pb.LABEL_SUCCESS if success else pb.LABEL_FAILURE

    def reset(self) -> None:
        """End the episode in progress and start a new one."""
        with self._lock:
            self._reset = True

    def take_label(self) -> int:
        with self._lock:
            label, self._label = self._label, pb.LABEL_NONE
            return label

    def take_reset(self) -> bool:
        with self._lock:
            reset, self._reset = self._reset, False
            return reset
