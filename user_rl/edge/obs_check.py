"""What the edge checks of a step before it records it: data the learner would refuse.

A sensor glitch or a diverging simulation can return NaN or inf in an observation (or a reward).
The learner refuses a batch that holds one (and keeps it in its quarantine); acting on it is no
better. So the daemon checks each new observation and, when one is unusable, ends the episode
there: the good steps before it are sent on their own, the step whose next observation is bad
goes alone in a batch of its own (the learner quarantines it, with the reason, and counts it),
an episode-end marker closes the episode, and the robot starts a new one with `reset()`. A
reset whose observation is unusable is retried, waiting a little longer each time (up to
`MAX_RESET_WAIT_S`), so a broken sensor does not make a real arm reset without pause.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import numpy as np

from user_rl.wire.transitions import OBS

log = logging.getLogger(__name__)

END_REASON = "bad_observation"  # the end_reason of an episode cut by an unusable observation
RESET_WAIT_S = 0.1  # before a reset retried after an unusable reset observation; doubles each time
MAX_RESET_WAIT_S = 5.0


def unusable(observation: Mapping[str, np.ndarray], reward: float = 0.0) -> str | None:
    """Why this step's data cannot be sent (a non-finite float observation or reward), or None."""
    for key, value in observation.items():
        array = np.asarray(value)
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            return f"{OBS}{key} holds NaN or inf"
    if not math.isfinite(reward):
        return "the reward is NaN or inf"
    return None


class ObservationCheck:
    """One robot's checks: counts unusable observations, keeps the newest reason for its health
    report, and paces resets that keep returning one."""

    def __init__(self, robot_id: str) -> None:
        self.robot_id = robot_id
        self.bad = 0  # unusable observations (or rewards) met
        self.error: str | None = None  # the newest, for the edge's last error
        self._bad_resets = 0  # in a row

    def step(self, observation: Mapping[str, np.ndarray], reward: float, episode: int, step: int) -> str | None:
        """Why the step that returned `observation` cannot be sent (its episode ends there), or None."""
        return self._found(unusable(observation, reward), f"episode {episode}, step {step}: episode ended")

    def reset(self, observation: Mapping[str, np.ndarray], episode: int) -> float | None:
        """None if the reset's observation is usable; else how long to wait before resetting again."""
        if self._found(unusable(observation), f"reset for episode {episode}: reset again") is None:
            self._bad_resets = 0
            return None
        self._bad_resets += 1
        return min(MAX_RESET_WAIT_S, RESET_WAIT_S * 2 ** (self._bad_resets - 1))

    def _found(self, why: str | None, where: str) -> str | None:
        if why is not None:
            self.bad += 1
            self.error = f"{why} ({where})"
            log.warning("%s: %s", self.robot_id, self.error)
        return why
