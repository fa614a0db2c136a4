"""The buffer's streams: one per (robot, epoch), in RAM while in use, in the index always.

A stream in RAM holds what its next batch needs (last seq, the record waiting for a
successor, open episodes). Thousands of (robot, epoch) hellos must not grow RAM or the index: a
stream is made by its first batch (a hello gets a stand-in, `unstored_stream`), the ingest
releases idle and drained streams (`release_stream`) and `stream()` reloads one from the index,
pending record included, so an episode continues. Opening a stream ends nothing: which older
edge lives are over is decided at a hello (`finished_streams`), from the robot's streams in RAM
and a partial index of open episodes, never by scanning every stream. Mixed into `PersistentReplay`
(it uses the store's index, pending commits and disk-error handling); ingest thread only.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from typing import TYPE_CHECKING

from user_rl.cloud.buffer.index import StreamRecord
from user_rl.cloud.buffer.recovery import load_stream
from user_rl.cloud.buffer.rows import StreamState
from user_rl.wire.transitions import DISCARD, EDGE_RESTART

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
    _unstored = 0  # the last stand-in id given out (`unstored_stream`), counting down from -1

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
        """The stream for (robot, epoch), made if new. Opening ends no other stream: which older
        lives are over is the ingest's call (`finished_streams`, at a hello)."""
        state = self.stream(robot, epoch)
        if state is not None:
            return state
        self._max_stream_id += 1
        return self.adopt_stream(StreamRecord(self._max_stream_id, robot, epoch, task))

    def unstored_stream(self, robot: str, epoch: int, task: str = "") -> StreamState:
        """A stand-in for a stream nothing was stored in yet (a hello, an announced epoch): kept
        nowhere, no id (negative), no index row. The first batch makes the real one (`open_stream`),
        so hellos that are never followed by data cost nothing."""
        self._unstored -= 1
        return StreamState(StreamRecord(self._unstored, robot, epoch, task), -1, -1)

    def stream_positions(self, robot: str, epochs: list[int]) -> dict[int, tuple[int, int]]:
        """(durable seq, last seq) of each of the robot's `epochs`, without loading any: (0, 0) for
        one never stored. One index query for those not in RAM."""
        ram = {e: self.streams.get((robot, e)) for e in epochs} if self._by_robot.get(robot) else dict.fromkeys(epochs)
        stored = self.index.last_seqs(robot, [e for e, s in ram.items() if s is None])
        return {
            e: (s.durable_seq, s.record.last_seq) if s is not None else (stored.get(e, 0),) * 2 for e, s in ram.items()
        }

    def finished_streams(
        self, robot: str, epoch: int, spooled: Collection[int], more_spooled: bool = False
    ) -> list[StreamState]:
        """At a hello of `epoch`: the robot's older streams with an open episode whose data has all
        arrived. An older epoch the edge names as spooled is not (its own `edge_restart` marker
        ends it after its data); unnamed ones are, except, while the edge says it spools more than
        it named (`more_spooled`, oldest named first), those newer than the newest named.
        O(the robot's streams in RAM + open episodes): the index query uses a partial index."""
        newest_named = max(spooled, default=-1)

        def over(e: int) -> bool:
            return e < epoch and e not in spooled and (not more_spooled or e < newest_named)

        found = [
            s
            for s in self._by_robot.get(robot, {}).values()
            if over(s.record.epoch)
            and (s.pending is not None or any(ep.status == "open" for ep in s.episodes.values()))
        ]
        for record in self.index.streams_with_open_episodes(robot, epoch):  # released ones
            if (robot, record.epoch) not in self.streams and over(record.epoch):
                found.append(load_stream(self, record))
        return found

    def end_lives(self, streams: list[StreamState]) -> None:
        """These streams' edge lives are over: end their open episodes (`edge_restart`) and let them
        leave RAM."""
        for stream in streams:
            self.end_open_episodes(stream, reason=EDGE_RESTART)
            self.release_stream(stream)

    def end_finished_streams(
        self, robot: str, epoch: int, spooled: Collection[int] = (), more_spooled: bool = False
    ) -> list[StreamState]:
        """`finished_streams`, ended (`end_lives`); the ingest commits in between (see there)."""
        finished = self.finished_streams(robot, epoch, spooled, more_spooled)
        self.end_lives(finished)
        return finished

    def adopt_stream(self, record: StreamRecord) -> StreamState:
        """Keep a stream in RAM (a new one, or one loaded from the index)."""
        state = StreamState(
            record,
            self.robots.setdefault(record.robot, len(self.robots)),
            self.tasks.setdefault(record.task, len(self.tasks)),
        )
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
