"""How evenly the control loop steps the robot: the p99 of |interval - period| over recent steps.

A robot's controller expects a command every period; a loop that waits on inference or weights
shows here first. Without a fixed period (a sim run as fast as it goes) the median interval stands in.
"""

from __future__ import annotations

import gc
import sys
import time
from collections import deque

import numpy as np

JITTER_WINDOW = 500  # steps


def keep_startup_objects_out_of_gc() -> None:
    """Collect once, then exempt everything alive (torch, MuJoCo, the policy: ~250k objects) from
    later collections. A full collection scans every tracked object and takes ~100 ms on a small
    controller, which a 50 Hz loop would feel as a stall at a random step."""
    gc.collect()
    gc.freeze()


GIL_SWITCH_S = 0.0005


def prepare_control_loop_process() -> None:
    """Before an edge's loop starts: keep the garbage collector's full scans away (below), and make
    any thread hand the interpreter lock over after 0.5 ms, not Python's 5 ms. The weight receiver
    and the inference worker share the process with the loop: at 5 ms a thread busy in Python while
    a version lands could hold a 50 Hz step back by a quarter of its period."""
    keep_startup_objects_out_of_gc()
    sys.setswitchinterval(GIL_SWITCH_S)


class LoopJitter:
    def __init__(self, period_s: float = 0.0) -> None:
        self.period_s = period_s
        self._last: float | None = None
        self._intervals: deque[float] = deque(maxlen=JITTER_WINDOW)

    def stepped(self, now: float | None = None) -> None:
        """The robot was just stepped (time.monotonic())."""
        now = time.monotonic() if now is None else now
        if self._last is not None:
            self._intervals.append(now - self._last)
        self._last = now

    def paused(self) -> None:
        """A gap that is not the loop's (a reset, an e-stop, waiting for the learner) starts afresh."""
        self._last = None

    def p99_ms(self) -> float:
        if not self._intervals:
            return 0.0
        intervals = np.fromiter(self._intervals, float)
        period = self.period_s or float(np.median(intervals))
        return round(1000 * float(np.percentile(np.abs(intervals - period), 99)), 3)
