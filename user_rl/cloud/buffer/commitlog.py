"""A small append-only log of commit records, each framed so a torn or damaged tail is detected.

The buffer writes one record each time rows become durable; after a crash the valid prefix says
which rows of the open segment to keep. Frame: u32 payload length, u32 crc32(payload), payload.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from types import TracebackType

_FRAME = struct.Struct("<II")
_MAX_PAYLOAD = 0xFFFFFFFF


class CommitLog:
    """Appends records to `path`; reopening continues after the valid records (a torn tail is cut off)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        _, self.dropped_bytes = CommitLog.read(self.path, truncate_torn_tail=True)
        created = not self.path.exists()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        if created:  # the log's directory entry must survive a crash too
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    @property
    def size(self) -> int:
        """Bytes in the log, including records not yet synced."""
        return self._size

    def append(self, payload: bytes) -> None:
        """Add one record (not yet durable: call `sync`). Empty payloads are refused because a
        zero-filled tail would otherwise read as valid empty records (crc32 of b"" is 0)."""
        if not 0 < len(payload) <= _MAX_PAYLOAD:
            raise ValueError(f"commit record payload must be 1..{_MAX_PAYLOAD} bytes, got {len(payload)}")
        record = memoryview(_FRAME.pack(len(payload), zlib.crc32(payload)) + bytes(payload))
        written = 0
        while written < len(record):
            written += os.write(self._require_open(), record[written:])
        self._size += len(record)

    def sync(self) -> None:
        """Make every appended record durable."""
        os.fdatasync(self._require_open())

    def truncate(self, size: int) -> None:
        """Best effort after a failed sync: cut records that were never made durable (and so
        never acknowledged) so a restart does not find them. Errors here are ignored."""
        try:
            os.ftruncate(self._require_open(), size)
            os.fsync(self._require_open())
            self._size = size
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _require_open(self) -> int:
        if self._fd is None:
            raise ValueError(f"commit log {self.path} is closed")
        return self._fd

    @staticmethod
    def read(path: Path, truncate_torn_tail: bool = False) -> tuple[list[bytes], int]:
        """The valid records from the start up to the first torn or corrupt one, and how many bytes
        follow them. `truncate_torn_tail` cuts those bytes off (durably) so appends continue cleanly."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return [], 0
        records, position = [], 0
        while position + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, position)
            payload = data[position + _FRAME.size : position + _FRAME.size + length]
            if length == 0 or len(payload) < length or zlib.crc32(payload) != crc:
                break
            records.append(payload)
            position += _FRAME.size + length
        dropped = len(data) - position
        if dropped and truncate_torn_tail:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, position)
                os.fsync(fd)
            finally:
                os.close(fd)
        return records, dropped
