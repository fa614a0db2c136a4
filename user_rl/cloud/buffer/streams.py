"""The buffer's streams: one per (robot, epoch), in RAM while in use, in the index always.

A stream in RAM holds what its next batch needs (last seq, the record waiting for a
successor, open episodes). Thousands of (robot, epoch) hellos must not grow RAM or the index: a
stream is made by its first batch (a hello gets a stand-in, `unstored`), the ingest releases
idle and drained streams (`release`) and `get()` reloads one from the index, pending record
included, so an episode continues. Opening a stream ends nothing: which older edge lives are
over is decided at a hello (`finished`), from the robot's streams in RAM and a partial index of
open episodes, never by scanning every stream. Ingest thread only (the sampler thread reads
`dropped_unpaired`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from user_rl.cloud.buffer.disk import DiskLatch
from user_rl.cloud.buffer.index import BufferIndex, StreamRecord
from user_rl.cloud.buffer.rows import StreamState


class StreamRegistry:
    """The streams in RAM, their robot and task codes, and their ids.

    `unsealed(stream)` says whether the store still holds the stream's data outside a sealed
    segment (it may not leave RAM before the seal); `restore_pending(stream)` reads back the
    record a reloaded stream's next batch continues."""

    def __init__(
        self,
        index: BufferIndex,
        disk: DiskLatch,
        unsealed: Callable[[StreamState], bool],
        restore_pending: Callable[[StreamState], None],
    ) -> None:
        self._index = index
        self._disk = disk
        self._unsealed = unsealed
        self._restore_pending = restore_pending
        self.in_ram: dict[tuple[str, int], StreamState] = {}
        self._by_robot: dict[str, dict[int, StreamState]] = {}  # robot -> epoch -> stream in RAM
        self._release_at_seal: set[tuple[str, int]] = set()
        self._max_id = 0  # the largest stream id ever stored
        self._unstored = 0  # the last stand-in id given out (`unstored`), counting down from -1
        self._dropped_released = 0  # records of released streams that never got a successor
        self.robots: dict[str, int] = {}  # robot name -> the code its rows carry
        self.tasks: dict[str, int] = {}  # task name -> the code its rows carry

    def get(self, robot: str, epoch: int) -> StreamState | None:
        """The stream for (robot, epoch): from RAM, or reloaded from the index if it was released."""
        state = self.in_ram.get((robot, epoch))
        if state is None:
            record = self._index.stream(robot, epoch)
            if record is None:
                return None
            state = self._reload(record)
        self._release_at_seal.discard((robot, epoch))
        return state

    def open(self, robot: str, epoch: int, task: str = "") -> StreamState:
        """The stream for (robot, epoch), made if new."""
        state = self.get(robot, epoch)
        if state is not None:
            return state
        return self.adopt(StreamRecord(self._max_id + 1, robot, epoch, task))

    def unstored(self, robot: str, epoch: int, task: str = "") -> StreamState:
        """A stand-in for a stream nothing was stored in yet: kept nowhere, no id (negative)."""
        self._unstored -= 1
        return StreamState(StreamRecord(self._unstored, robot, epoch, task), -1, -1)

    def positions(self, robot: str, epochs: list[int]) -> dict[int, tuple[int, int]]:
        """(durable seq, last seq) of each of the robot's `epochs`, without loading any: (0, 0) for
        one never stored. One index query for those not in RAM."""
        ram = {e: self.in_ram.get((robot, e)) for e in epochs} if self._by_robot.get(robot) else dict.fromkeys(epochs)
        stored = self._index.last_seqs(robot, [e for e, s in ram.items() if s is None])
        return {
            e: (s.durable_seq, s.record.last_seq) if s is not None else (stored.get(e, 0),) * 2 for e, s in ram.items()
        }

    def finished(
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
        for record in self._index.streams_with_open_episodes(robot, epoch):  # released ones
            if (robot, record.epoch) not in self.in_ram and over(record.epoch):
                found.append(self._reload(record))
        return found

    def adopt(self, record: StreamRecord) -> StreamState:
        """Keep a stream in RAM (a new one, or one loaded from the index)."""
        state = StreamState(record, self.robot_code(record.robot), self.task_code(record.task))
        state.durable_seq = record.last_seq
        self.in_ram[(record.robot, record.epoch)] = state
        self._by_robot.setdefault(record.robot, {})[record.epoch] = state
        self.note_id(record.id)
        return state

    def note_id(self, stream_id: int) -> None:
        """A stream id is in use (in the index): a new stream gets a larger one."""
        self._max_id = max(self._max_id, stream_id)

    def robot_code(self, robot: str) -> int:
        return self.robots.setdefault(robot, len(self.robots))

    def task_code(self, task: str) -> int:
        return self.tasks.setdefault(task, len(self.tasks))

    def release(self, stream: StreamState) -> bool:
        """Drop a stream from RAM (its record stays in the index; `get()` reloads it).

        True when dropped now; False when it still has data in the open segment: it is then
        dropped when that segment is sealed (`release_deferred`), unless it is used again before."""
        key = (stream.record.robot, stream.record.epoch)
        if self.in_ram.get(key) is not stream:
            return True
        if self._unsealed(stream):
            self._release_at_seal.add(key)
            return False
        if self._disk.failure is not None:  # nothing more is written; the stream stays as it is
            return False
        with self._disk.writing("release a stream"):
            self._index.update_episodes(list(stream.episodes.values()), [stream.record])
        del self.in_ram[key]
        epochs = self._by_robot[key[0]]
        del epochs[key[1]]
        if not epochs:
            del self._by_robot[key[0]]
        self._release_at_seal.discard(key)
        self._dropped_released += stream.dropped
        return True

    def release_deferred(self) -> None:
        """Release the streams that waited for the seal of their data."""
        for key in list(self._release_at_seal):
            stream = self.in_ram.get(key)
            if stream is None or self.release(stream):
                self._release_at_seal.discard(key)

    def dropped_unpaired(self) -> int:
        """Records that never got a successor (a cut episode, a lost batch), released streams included."""
        streams = list(self.in_ram.values())  # one C-level copy: the ingest thread may add streams
        return self._dropped_released + sum(s.dropped for s in streams)

    def _reload(self, record: StreamRecord) -> StreamState:
        """A stream released from RAM, back from the index: open episodes, records, pending record."""
        state = self.adopt(record)
        state.episodes = {ep.episode: ep for ep in self._index.episodes(record.id) if ep.status == "open"}
        state.records = self._index.stream_records(record.id).get(record.id, 0)
        self._restore_pending(state)
        return state
