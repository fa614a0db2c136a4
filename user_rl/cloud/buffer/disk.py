"""The buffer's write-failure latch: the first disk error stops the buffer for good.

After an error nothing more is acknowledged (an ack means durable), so every later write
refuses with `BufferWriteError`. The store and its stream registry write through one latch.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)


class BufferWriteError(OSError):
    """The buffer could not write to disk. Nothing after the last successful commit is durable,
    and the buffer refuses every later add/commit/seal: data must not be acked any more."""


class DiskLatch:
    """Turns a disk error into `BufferWriteError` and remembers it (`failure`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.failure: str | None = None  # the disk error that stopped the buffer

    @contextmanager
    def writing(self, what: str) -> Iterator[None]:
        """Turn a disk error into BufferWriteError and stop the buffer for good."""
        try:
            yield
        except BufferWriteError:
            raise
        except (OSError, sqlite3.OperationalError) as error:
            self.failure = f"{what}: {type(error).__name__}: {error}"
            log.error("buffer %s: write failed (%s); it takes no more data", self.directory, self.failure)
            raise BufferWriteError(getattr(error, "errno", None), f"buffer write failed: {self.failure}") from error

    def check_writable(self) -> None:
        if self.failure is not None:
            raise BufferWriteError(None, f"the buffer stopped taking data after a write failure: {self.failure}")
