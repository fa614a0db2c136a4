"""Stream epochs that only go forward, whatever the wall clock does.

A stream epoch names one life of an edge daemon: the learner keeps one stream per (robot,
epoch) and treats a higher epoch as a later life (the older one's open episode was cut
short). Epochs therefore must never repeat and must order the lives of one robot, also when
the robot's clock is stepped back (NTP, a dead RTC battery).

With a spool directory that outlives the daemon (real robots, standalone edges) the epoch is a
counter in a small file next to the spool: the next life gets max(counter, newest epoch
still spooled) + 1, written atomically and fsynced before the epoch is used. A sim with a
throw-away spool directory has no such home; its counter lives in the host's temp directory
under the robot id, and the epoch is max(counter + 1, wall clock in ns): monotonic on that
host, and ordered by time when the sim moves to another host.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from user_rl.files import replace_durably

log = logging.getLogger(__name__)

COUNTER_NAME = "stream_epoch"  # inside the spool directory
MAX_EPOCH = 2**63 - 1  # the learner indexes epochs as signed 64-bit


def next_epoch(spool_dir: Path | None, robot_id: str, spooled: Iterable[int] = ()) -> int:
    """The epoch for a new life of `robot_id`'s edge; persisted before it is returned.

    `spool_dir` None: the spool is temporary (a sim); `spooled`: epochs found in the spool."""
    if spool_dir is not None:
        counter = Path(spool_dir) / COUNTER_NAME
        last = _read(counter)
        epoch = max(time.time_ns() if last is None else last, *spooled, 0) + 1
    else:
        counter = temp_counter_path(robot_id)
        epoch = max((_read(counter) or 0) + 1, time.time_ns())
    if epoch > MAX_EPOCH:
        raise ValueError(f"stream epoch counter {counter} is at {epoch - 1}; the learner takes at most {MAX_EPOCH}")
    _write_atomic(counter, epoch)
    return epoch


def temp_counter_path(robot_id: str) -> Path:
    """Where a sim with a temporary spool keeps its epoch counter on this host."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", robot_id)[:64]
    digest = hashlib.sha256(robot_id.encode()).hexdigest()[:12]  # two ids that sanitise alike stay apart
    return Path(tempfile.gettempdir()) / f"user-rl-epochs-{os.getuid()}" / f"{safe}-{digest}"


def _read(path: Path) -> int | None:
    """The counter's value: 0 for no file; None for a file that cannot be trusted."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log.warning("stream epoch counter %s cannot be read (%s): continuing from the wall clock", path, exc)
        return None
    if not text.isdigit():
        # A value from the clock is far above any counter value: no epoch this robot used can come back.
        log.warning("stream epoch counter %s holds %r, not a number: continuing from the wall clock", path, text[:40])
        return None
    return int(text)


def _write_atomic(path: Path, value: int) -> None:
    replace_durably(path, f"{value}\n")
