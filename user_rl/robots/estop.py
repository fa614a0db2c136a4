"""A latched emergency stop per robot: a file in the robot's spool directory. Anything on the
robot's controller can trip it (`user-rl estop`, a UI, a script, a hardware button's handler);
the edge daemon holds the robot and takes no step until someone re-arms it (`user-rl rearm`).
Being a file, the latch survives a restart of the edge daemon: a robot stopped stays stopped.

A stop records where it came from (`source`: "cli", "page", "watchdog", "robot"; a latch file
without one counts as "robot") and who set it (`by`), because who may clear it depends on that
(the teleop page's rules: user_rl/edge/teleop/authority.py). Clearing it records who re-armed it
next to the latch (`ESTOP.rearmed`), so the edge's status and page can say so.

    latch = EStopLatch.for_robot(spool_root, "arm-0")
    latch.trip("operator: gripper jammed", source="cli", by="alice")
    latch.tripped()   # "operator: gripper jammed" (None when armed)
    latch.stop()      # {"reason": ..., "source": "cli", "by": "alice", "time": ...}
    latch.clear(by="cli:alice")
    latch.last_rearm()  # {"by": "cli:alice", "time": ..., "reason": ..., "source": "cli"}
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from user_rl.files import replace_durably

LATCH_NAME = "ESTOP"
REARMED_SUFFIX = ".rearmed"
UNKNOWN_SOURCE = "robot"  # a latch written by hand or by an older version: the strict rules apply


class EStopLatch:
    def __init__(self, path: str | Path, recheck_s: float = 0.01) -> None:
        self.path = Path(path)
        self.recheck_s = recheck_s
        self._checked = -1.0
        self._stop: dict | None = None

    @classmethod
    def for_robot(cls, spool_root: str | Path, robot_id: str) -> EStopLatch:
        return cls(Path(spool_root) / robot_id / LATCH_NAME)

    @property
    def rearmed_path(self) -> Path:
        return self.path.with_name(self.path.name + REARMED_SUFFIX)

    def trip(self, reason: str = "emergency stop", source: str = UNKNOWN_SOURCE, by: str = "") -> None:
        """Stop the robot until `clear()`; atomic, so a reader never sees half a latch."""
        record = {"reason": reason, "time": time.time(), "source": source, "by": by}
        replace_durably(self.path, json.dumps(record))  # survives a power cut
        self._checked = -1.0

    def clear(self, by: str = "") -> bool:
        """Re-arm, recording who did; False if it was not tripped."""
        self._checked = -1.0
        stop = self._read()
        if stop is None:
            return False
        # who re-armed is written first, so that whoever sees the latch gone reads who cleared it
        cleared = {"by": by or "unknown", "time": time.time(), "reason": stop["reason"], "source": stop["source"]}
        replace_durably(self.rearmed_path, json.dumps(cleared))
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True

    def stop(self) -> dict | None:
        """The stop while tripped ({"reason", "source", "by", "time"}), else None (the file is looked
        at most every `recheck_s`)."""
        now = time.monotonic()
        if now - self._checked >= self.recheck_s:
            self._checked = now
            self._stop = self._read()
        return self._stop

    def tripped(self) -> str | None:
        """The reason while tripped, else None."""
        stop = self.stop()
        return stop["reason"] if stop else None

    def last_rearm(self) -> dict | None:
        """Who re-armed this robot last, when, and what stop they cleared (None: never re-armed here)."""
        try:
            record = json.loads(self.rearmed_path.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and "by" in record else None

    def rearm_text(self) -> str:
        """`last_rearm` in words, for the heartbeat and `user-rl status` ("" when never re-armed)."""
        rearm = self.last_rearm()
        if rearm is None:
            return ""
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(rearm.get("time") or 0.0)))
        return f"by {rearm['by']} at {at} (cleared the {rearm.get('source', '?')} stop: {rearm.get('reason', '')})"[
            :200
        ]

    def _read(self) -> dict | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):  # unreadable or half-written by hand: stopped all the same
            return {"reason": "emergency stop", "source": UNKNOWN_SOURCE, "by": "", "time": 0.0}
        if not isinstance(data, dict):
            data = {}
        try:
            when = float(data.get("time") or 0.0)
        except (TypeError, ValueError):
            when = 0.0
        return {
            "reason": str(data.get("reason") or "emergency stop"),
            "source": str(data.get("source") or UNKNOWN_SOURCE),
            "by": str(data.get("by") or ""),
            "time": when,
        }
