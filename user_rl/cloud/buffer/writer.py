"""What the ingest may do to the run's buffer: take batches, keep streams, make them durable.

The learner owns the buffer (it opens, samples and closes it); the ingest thread is handed it as a
`BufferWriter`, so everything the ingest touches is listed here and sampling, attaching and closing
stay with the owner. `PersistentReplay` is the one implementation."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

import numpy as np

from user_rl.cloud.buffer.rows import StreamState


class BufferWriter(Protocol):
    @property
    def records(self) -> int:
        """Step records stored for this run's robots (own data only): a paced fleet's credit counts them."""
        ...

    @property
    def failure(self) -> str | None:
        """The disk error that stopped the buffer (None while it takes data)."""
        ...

    def stream(self, robot: str, epoch: int) -> StreamState | None: ...

    def open_stream(self, robot: str, epoch: int, task: str = "") -> StreamState: ...

    def unstored_stream(self, robot: str, epoch: int, task: str = "") -> StreamState: ...

    def stream_positions(self, robot: str, epochs: list[int]) -> dict[int, tuple[int, int]]: ...

    def finished_streams(
        self, robot: str, epoch: int, spooled: Collection[int], more_spooled: bool = False
    ) -> list[StreamState]: ...

    def release_stream(self, stream: StreamState) -> bool: ...

    def end_lives(self, streams: list[StreamState]) -> None: ...

    def end_open_episodes(self, stream: StreamState, reason: str) -> None: ...

    def add(self, stream: StreamState, seq: int, cols: dict[str, np.ndarray], people: Sequence[str] = ()) -> bool: ...

    def record_lost(self, stream: StreamState, seq: int, counted: bool = True) -> bool: ...

    def commit(self) -> list[StreamState]: ...

    def start_commit(self) -> bool: ...

    def finish_commit(self, wait: bool = False) -> list[StreamState]: ...

    @property
    def commit_running(self) -> bool: ...

    def stats(self) -> dict: ...
