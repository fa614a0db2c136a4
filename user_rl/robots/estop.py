"""A latched emergency stop per robot: a file in the robot's spool directory. Anything on the
robot's controller can trip it (`user-rl estop`, a UI, a script, a hardware button's handler);
the edge daemon holds the robot and takes no step until someone re-arms it (`user-rl rearm`).
Being a file, the latch survives a restart of the edge daemon: a robot stopped stays stopped.

    latch = EStopLatch.for_robot(spool_root, "arm-0")
    latch.trip("operator: gripper jammed")
    latch.tripped()   # "operator: gripper jammed" (None when armed)
    latch.clear()
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from user_rl.files import replace_durably

LATCH_NAME = "ESTOP"


class EStopLatch:
    def __init__(self, path: str | Path, recheck_s: float = 0.01) -> None:
        self.path = Path(path)
        self.recheck_s = recheck_s
        self._checked = -1.0
        self._reason: str | None = None

    @classmethod
    def for_robot(cls, spool_root: str | Path, robot_id: str) -> "EStopLatch":
        return cls(Path(spool_root) / robot_id / LATCH_NAME)

    def trip(self, reason: str = "emergency stop") -> None:
        """Stop the robot until `clear()`; atomic, so a reader never sees half a latch."""
        replace_durably(self.path, json.dumps({"reason": reason, "time": time.time()}))  # survives a power cut
        self._checked = -1.0

    def clear(self) -> bool:
        """Re-arm; False if it was not tripped."""
        self._checked = -1.0
        try:
            self.path.unlink()
            return True
        except FileNotFoundError:
            return False

    def tripped(self) -> str | None:
        """The reason while tripped, else None (the file is looked at most every `recheck_s`)."""
        now = time.monotonic()
        if now - self._checked >= self.recheck_s:
            self._checked = now
            try:
                self._reason = json.loads(self.path.read_text()).get("reason") or "emergency stop"
            except FileNotFoundError:
                self._reason = None
            except (OSError, ValueError):  # unreadable or half-written by hand: stopped all the same
                self._reason = "emergency stop"
        return self._reason
