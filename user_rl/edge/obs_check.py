"""What the edge checks of a step before it records it: data the learner would refuse.

A sensor glitch or a diverging simulation can return NaN or inf in an observation (or a reward).
The learner refuses a batch that holds one (and keeps it in its quarantine); acting on it is no
better. So the daemon checks each new observation and, when one is unusable, ends the episode
there: the good steps before it are sent on their own, the step whose next observation is bad
goes alone in a batch of its own (the learner quarantines it, with the reason, and counts it),
an episode-end marker closes the episode, and the robot starts a new one with `reset()`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from user_rl.wire.transitions import OBS

END_REASON = "bad_observation"  # the end_reason of an episode cut by an unusable observation


def unusable(observation: Mapping[str, np.ndarray], reward: float = 0.0) -> str | None:
    """Why this step's data cannot be sent (a non-finite float observation or reward), or None."""
    for key, value in observation.items():
        array = np.asarray(value)
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            return f"{OBS}{key} holds NaN or inf"
    if not math.isfinite(reward):
        return "the reward is NaN or inf"
    return None
