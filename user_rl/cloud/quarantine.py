"""The learner's quarantine: batches it refused, kept with the reason, so the stream goes on.

A batch whose content the learner cannot use (a NaN in an observation, a column of the wrong
shape) would be refused the same way every time it is sent again. Stopping its stream for it
would stop the robot's data for good; dropping it without a trace would hide a sensor or a sim
going wrong. So the ingest keeps it here and its stream moves past it.

Layout: `<buffer dir>/quarantine/<robot>.jsonl`, one JSON line per refused batch: when, the
stream (robot, epoch, seq), its row count, the reason, and the message itself (the envelope and
each array frame, base64), which `read_quarantine` decodes back into a `Message`.

Bounded: all files together stay under `max_bytes`. A batch that does not fit is recorded by
its line alone (no frames); once even that does not fit nothing more is written: the refusal
is still counted, acknowledged and logged, and `report()` says the quarantine is full. A disk
error writing here is logged and counted, never raised: the quarantine is evidence, not data.
(A learner killed before it committed a refusal takes that batch again: it may appear twice.)
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from user_rl.wire.codec import Message, decode

log = logging.getLogger(__name__)

DIRECTORY = "quarantine"
MAX_BYTES = 256 << 20  # all quarantined batches of a run together
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def quarantine_file(directory: Path, robot_id: str) -> Path:
    """The robot's file; an id that is not a safe file name gets a readable name plus a hash of it."""
    safe = _SAFE.sub("_", robot_id).lstrip(".") or "_"
    if safe != robot_id:
        safe = f"{safe[:64]}-{hashlib.sha256(robot_id.encode()).hexdigest()[:12]}"
    return directory / f"{safe}.jsonl"


class Quarantine:
    """Refused batches on disk, per robot, within `max_bytes` in all (see the module docstring)."""

    def __init__(self, directory: str | Path, max_bytes: int = MAX_BYTES, max_logged: int = 20) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.max_logged = max_logged
        self.batches = 0  # refused batches (this run), kept or not
        self.kept = 0  # batches written with their frames (this run)
        self.not_kept = 0  # refused batches whose frames were left out (full, or a disk error)
        self.write_error: str | None = None
        self._full_logged = False
        # What earlier runs left counts against the bound (a handful of files: read once).
        self.bytes = sum(p.stat().st_size for p in self.directory.glob("*.jsonl")) if self.directory.is_dir() else 0

    @classmethod
    def of_buffer(cls, buffer_dir: str | Path, max_bytes: int = MAX_BYTES) -> Quarantine:
        """The quarantine of the run whose buffer is at `buffer_dir`."""
        return cls(Path(buffer_dir) / DIRECTORY, max_bytes)

    @property
    def full(self) -> bool:
        return self.bytes >= self.max_bytes

    def keep(self, msg: Message, reason: str) -> bool:
        """Write one refused batch; True if its frames were kept (else its line alone, or nothing)."""
        body, robot_id = msg.body, msg.envelope.robot_id
        self.batches += 1
        if self.batches <= self.max_logged:
            log.warning(
                "robot %s: refused batch %d of epoch %d (%s); kept in %s, the stream goes on",
                robot_id,
                body.seq,
                body.stream_epoch,
                reason,
                self.directory,
            )
        record = {
            "time": time.time(),
            "robot": robot_id,
            "epoch": body.stream_epoch,
            "seq": body.seq,
            "count": body.count,
            "reason": reason,
        }
        head = msg.envelope.SerializeToString()
        encoded = 4 * (len(head) + sum(a.nbytes for a in msg.arrays.values())) // 3 + 1024  # base64, and the rest
        if self.bytes + encoded <= self.max_bytes:  # only then are the frames encoded
            if self._append(robot_id, _line(record, head, msg)):
                self.kept += 1
                return True
        else:
            self._append(robot_id, _line({**record, "frames": "not kept: the quarantine is full"}))  # while it fits
        if not self._full_logged and self.write_error is None:
            self._full_logged = True
            log.warning(
                "the quarantine in %s is full (%d MiB): refused batches are still counted and "
                "acknowledged, their frames no longer kept",
                self.directory,
                self.max_bytes >> 20,
            )
        self.not_kept += 1
        return False

    def _append(self, robot_id: str, data: bytes) -> bool:
        """One line onto the robot's file, if it fits the bound; False if not written."""
        if self.bytes + len(data) > self.max_bytes:
            return False
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(quarantine_file(self.directory, robot_id), "ab") as f:
                f.write(data)
        except OSError as exc:  # a full or failing disk: the refusal still counts, the stream goes on
            self.write_error = f"{type(exc).__name__}: {exc}"[:300]
            log.error("could not write a refused batch to the quarantine in %s: %s", self.directory, exc)
            self.bytes += len(data)  # part of it may be on disk: counted, so the bound holds
            return False
        self.bytes += len(data)
        return True

    def report(self) -> dict:
        return {
            "batches": self.batches,
            "directory": str(self.directory),
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "full": self.full,
            "frames_not_kept": self.not_kept,
            "write_error": self.write_error,
        }


def read_quarantine(path: str | Path) -> Iterator[tuple[dict, Message | None]]:
    """(the line's record, the refused message or None when its frames were not kept) per batch."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # cut short by a disk error while it was written
                continue
            if "envelope" not in record:
                yield record, None
                continue
            frames = [base64.b64decode(record.pop("envelope")), *map(base64.b64decode, record.pop("arrays"))]
            yield record, decode(frames)


def _line(record: dict, envelope: bytes | None = None, msg: Message | None = None) -> bytes:
    """One JSON line: the record, and the message's frames in base64 when given. Built as bytes
    (base64 needs no JSON escaping): a batch of megabytes costs milliseconds, not a JSON dump."""
    head = json.dumps(record).encode()
    if msg is None or envelope is None:
        return head + b"\n"
    frames = [base64.b64encode(memoryview(np.ascontiguousarray(a)).cast("B")) for a in msg.arrays.values()]
    quoted = b'["' + b'", "'.join(frames) + b'"]' if frames else b"[]"
    return b"".join([head[:-1], b', "envelope": "', base64.b64encode(envelope), b'", "arrays": ', quoted, b"}\n"])
