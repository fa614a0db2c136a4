"""Key -> robot latency as everyone watching a robot sees it, measured on the robot.

A driver's page stamps each motion command with when its key was pressed, on the robot's clock
(the page's ping gives the offset); the loop reports when the command's first step went to the
robot. The difference is the latency a person feels. A command that waited out an e-stop is left
out: the robot was stopped on purpose, so that wait says nothing about the link or the loop.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

WINDOW = 200  # the latest samples the quantiles are over
PENDING = 500  # commands remembered until their first step (a page that floods them costs no more)


class KeyLatency:
    """The last `WINDOW` key -> robot latencies (ms) of a robot's drivers."""

    def __init__(self) -> None:
        self._pressed: OrderedDict[tuple[str, int], float] = OrderedDict()  # (client, command id) -> ms
        self._samples: deque[float] = deque(maxlen=WINDOW)
        self.left_out = 0  # commands that waited out an e-stop

    def pressed(self, client: str, command_id: int, pressed_at_ms: float) -> None:
        self._pressed[(client, command_id)] = float(pressed_at_ms)
        while len(self._pressed) > PENDING:
            self._pressed.popitem(last=False)

    def applied(self, client: str, command_id: int, sent_at_s: float, rearmed_at_s: float | None) -> float | None:
        """The command's latency (ms), or None: not stamped, or it waited out an e-stop."""
        pressed = self._pressed.pop((client, command_id), None)
        if pressed is None:
            return None
        if rearmed_at_s is not None and rearmed_at_s * 1000.0 > pressed:
            self.left_out += 1
            return None
        latency = sent_at_s * 1000.0 - pressed
        self._samples.append(latency)
        return latency

    def summary(self) -> dict | None:
        """p50 / p99 / count over the window, for the page (None before the first sample)."""
        if not self._samples:
            return None
        values = np.fromiter(self._samples, float)
        return {
            "p50_ms": round(float(np.percentile(values, 50)), 1),
            "p99_ms": round(float(np.percentile(values, 99)), 1),
            "n": len(values),
            "left_out_estop": self.left_out,
        }
