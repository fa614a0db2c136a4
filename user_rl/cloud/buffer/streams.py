"""The buffer's streams: one per (robot, epoch), in RAM while in use, in the index always.

A stream in RAM holds what its next batch needs (last seq, the record waiting for a
successor, open episodes). Thousands of (robot, epoch) hellos must not grow RAM: the ingest
releases idle streams (`release_stream`) and `stream()` reloads one from the index, pending
record included, so an episode continues. A per-robot index keeps a hello from scanning
every stream. Mixed into `PersistentReplay` (it uses the store's index, pending commits and
disk-error handling); ingest thread only.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from user_rl.cloud.buffer.index import StreamRecord
from user_rl.cloud.buffer.recovery import load_stream
from user_rl.cloud.buffer.rows import StreamState
from user_rl.wire.transitions import DISCARD

if TYPE_CHECKING:
    from user_rl.cloud.buffer.cache import SlotCache
    from user_rl.cloud.buffer.index import BufferIndex


class StreamRegistry:
    """Stream methods of `PersistentReplay` (which provides these attributes and `_disk`)."""

    index: BufferIndex
    streams: dict[tuple[str, int], StreamState]
    _by_robot: dict[str, dict[int, StreamState]]
    _release_at_seal: set[tuple[str, int]]
    _max_stream_id: int
    robots: dict[str, int]
    tasks: dict[str, int]
    failure: str | None
    _dropped_released: int
    _pending_commits: list
    _open_batches: list
    cache: SlotCache
    _lock: threading.RLock

    def stream(self, robot: str, epoch: int) -> StreamState | None:
        """The stream for (robot, epoch): from RAM, or reloaded from the index if it was released."""
        state = self.streams.get((robot, epoch))
        if state is None:
            record = self.index.stream(robot, epoch)
            if record is None:
                return None
            state = load_stream(self, record)
        self._release_at_seal.discard((robot, epoch))
        return state

    def open_stream(self, robot: str, epoch: int, task: str = "") -> StreamState:
        """The stream for (robot, epoch); a new epoch ends the robot's older streams' open episodes."""
        state = self.stream(robot, epoch)
        if state is not None:
            return state
        for other in list(self._by_robot.get(robot, {}).values()):
            if other.record.epoch < epoch:  # a stale epoch ends nothing
                self.end_open_episodes(other, reason="edge_restart")
        for record in self.index.streams_with_open_episodes(robot, epoch):  # released ones
            if (robot, record.epoch) not in self.streams:
                other = load_stream(self, record)
                self.end_open_episodes(other, reason="edge_restart")
                self.release_stream(other)
        self._max_stream_id += 1
        return self.adopt_stream(StreamRecord(self._max_stream_id, robot, epoch, task))

    def adopt_stream(self, record: StreamRecord) -> StreamState:
        """Keep a stream in RAM (a new one, or one loaded from the index)."""
        state = StreamState(record, self.robots.setdefault(record.robot, len(self.robots)),
                            self.tasks.setdefault(record.task, len(self.tasks)))
        state.durable_seq = record.last_seq
        self.streams[(record.robot, record.epoch)] = state
        self._by_robot.setdefault(record.robot, {})[record.epoch] = state
        self._max_stream_id = max(self._max_stream_id, record.id)
        return state

    def release_stream(self, stream: StreamState) -> bool:
        """Drop a stream from RAM (its record stays in the index; `stream()` reloads it).

        True when dropped now; False when it still has data in the open segment: it is then
        dropped when that segment is sealed, unless it is used again before."""
        key = (stream.record.robot, stream.record.epoch)
        if self.streams.get(key) is not stream:
            return True
        sid = stream.record.id
        if any(p[0] is stream for p in self._pending_commits) or any(b[0] == sid for b in self._open_batches):
            self._release_at_seal.add(key)
            return False
        if self.failure is not None:  # nothing more is written; the stream stays as it is
            return False
        with self._disk("release a stream"):
            self.index.update_episodes(list(stream.episodes.values()), [stream.record])
        del self.streams[key]
        epochs = self._by_robot[key[0]]
        del epochs[key[1]]
        if not epochs:
            del self._by_robot[key[0]]
        self._release_at_seal.discard(key)
        self._dropped_released += stream.dropped
        return True

    def end_open_episodes(self, stream: StreamState, reason: str) -> None:
        """The robot's edge restarted or detached mid-episode: that episode is over, cut short
        (truncated, with the reason), and its last step gets no successor."""
        ended = [ep for ep in stream.episodes.values() if ep.status == "open"]
        if not ended and stream.pending is None:
            return
        for ep in ended:
            ep.status, ep.end_reason = "truncated", reason
        if reason == DISCARD:  # a person's re-record: kept on disk, never sampled
            with self._lock:
                self.discarded_rows += sum(max(ep.length - 1, 0) for ep in ended)
                self.cache.discard([(ep.stream, ep.episode) for ep in ended])
        stream.dropped += int(stream.pending is not None)  # its last record never gets a successor
        stream.pending, stream.pending_at = None, None
        if self.failure is None:  # after a write failure the next open recovers from the commit log
            with self._disk("end an episode"):
                self.index.update_episodes(list(stream.episodes.values()))

    def last_seq(self, robot: str, epoch: int) -> int:
        state = self.stream(robot, epoch)
        return state.record.last_seq if state else 0

    def _release_deferred(self) -> None:
        for key in list(self._release_at_seal):
            stream = self.streams.get(key)
            if stream is None or self.release_stream(stream):
                self._release_at_seal.discard(key)

