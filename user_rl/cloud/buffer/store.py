"""The persistent replay buffer: what the ingest appends to and the learner samples from.

Write path: a batch is laid out as rows (`rows.layout`), written in place into the open
segment file and copied into its RAM slot, so it can be sampled at once. `commit()` makes
everything appended so far durable (fdatasync of the segment, then one commit-log record per
batch, fsynced) and reports which streams advanced, so the ingest can acknowledge them. The
ingest's periodic group commit runs the same steps on a commit thread instead (`start_commit`,
then `finish_commit` once it is done), so batches keep arriving while the disk syncs; only what
that commit covered is reported durable. A full segment is sealed (crc, fsync, rename) and
registered in the SQLite index in one transaction.
A disk error stops the buffer for good (`BufferWriteError`, `failure`): nothing is acked after it.

Read path: the sampler draws from the catalog of cached transitions; a batch is one numpy
gather over the slot arrays. Data larger than the RAM budget is rotated through the cache by
the prefetcher (`prefetch.py`), so sampling never waits on disk. Sealed segments are checked
against their crc when first loaded and by a background scrub (`scrub.py`), not at start-up.

Parts, each owning its state and handed only what it needs: the stream registry
(`streams.py`), the segment catalog (`catalog.py`), the RAM cache (`cache.py`), the disk-failure
latch (`disk.py`), the prefetcher and the scrub (background threads); `recovery.py` fills them
when a directory is opened. The store holds the write journal (batches not yet sealed) and the
counters, and wires the parts together.

Threads: one ingest thread writes (open_stream, stream, add, record_lost, commit, start_commit,
finish_commit, seal, end_open_episodes, release_stream, batch_keys, close) while one sampler thread
reads (sample, __len__, stats). One lock guards the RAM cache, its catalog and the counters; it is
held for the gather of a batch and for cache updates, never across an fsync. The commit thread
only syncs the open segment's file and appends to and syncs its commit log, which nothing else
touches until `finish_commit` has collected it (seal and close wait for it first).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym
import numpy as np

from user_rl.cloud.buffer.cache import SlotCache
from user_rl.cloud.buffer.catalog import SegmentCatalog
from user_rl.cloud.buffer.commitlog import CommitLog
from user_rl.cloud.buffer.disk import BufferWriteError, DiskLatch
from user_rl.cloud.buffer.index import CONTROL_HZ, BufferIndex, SegmentRecord
from user_rl.cloud.buffer.people import PeopleTable
from user_rl.cloud.buffer.prefetch import Prefetcher
from user_rl.cloud.buffer.recovery import attach_history, fill_cache, load_existing, open_meta, restore_pending
from user_rl.cloud.buffer.rows import KIND_RECORD, StreamState, layout, row_bytes, segment_schema
from user_rl.cloud.buffer.sampling import EMPTY, SOURCES, Sampler, SamplerSettings
from user_rl.cloud.buffer.scrub import Scrubber
from user_rl.cloud.buffer.segment import CorruptSegment, SegmentWriter
from user_rl.cloud.buffer.streams import StreamRegistry
from user_rl.config import BufferConfig
from user_rl.wire.transitions import (
    DISCARD,
    EDGE_RESTART,
    FINAL_OBS,
    FINAL_ROW,
    IDLE,
    NEXT_OBS,
    OBS,
    POLICY_ACTION,
    intervened,
)

log = logging.getLogger(__name__)
ONLINE = SOURCES.index("online")
REDRAWS = 32  # rounds of rejection, at most, that down-weight stale and idle transitions in a batch
POPULATE_AHEAD_BYTES = 16 << 20  # of the open RAM slot, faulted in ahead of the ingest (`_populate_ahead`)


class NothingToSample(ValueError):
    """Nothing in RAM may be drawn now (discarded, stale, idle or outside the mix): the learner waits."""


class AllStale(NothingToSample):
    """Nothing to sample but stale transitions, and the buffer drops those (`stale_data: drop`)."""


__all__ = ["NEXT_OBS", "AllStale", "BufferWriteError", "NothingToSample", "PersistentReplay"]


def segment_file(directory: Path, segment: int, open_: bool = False) -> Path:
    return directory / (f"open-{segment:08d}.seg" if open_ else f"seg-{segment:08d}.seg")


def commit_file(directory: Path, segment: int) -> Path:
    return directory / f"open-{segment:08d}.log"


class PersistentReplay:
    def __init__(
        self,
        directory: str | Path,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        settings: BufferConfig | None = None,
        gamma: float = 0.99,
    ) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.settings = s = settings or BufferConfig()
        self.gamma = gamma
        self.obs_keys = sorted(obs_space.spaces)
        self.schema = segment_schema(obs_space, action_space)
        self.index = BufferIndex(self.dir / "index.sqlite")
        self.people = PeopleTable(self.index)  # the names the rows' person columns refer to
        self.segment_rows = open_meta(self.index, obs_space, action_space, self.schema, s.segment_mb)
        slot_bytes = self.segment_rows * row_bytes(self.schema)
        self.sampler = Sampler(SamplerSettings(s.strategy, s.recency_half_life, s.mix))
        self.cache = SlotCache(
            self.schema,
            self.segment_rows,
            max(2, int(s.ram_budget_mb * 2**20 // slot_bytes)),
            s.max_policy_lag,
            drop_stale=s.stale_data == "drop",
            sampler=self.sampler,
            drop_idle=s.idle_rows == "drop",
        )
        self._lock = threading.RLock()  # the cache, its catalog and the counters: ingest vs sampler thread
        self.catalog = SegmentCatalog(self.dir)
        self._disk = DiskLatch(self.dir)
        self._streams = StreamRegistry(self.index, self._disk, self._unsealed, self._restore_pending)
        self._thread_errors: dict[str, str] = {}
        self._closed = False
        self._pending_commits: list[tuple[StreamState, int, int, int, bool]] = []  # stream, seq, records, end row, lost
        # A group commit running on the commit thread: its batches (as in _pending_commits) and its end.
        self._syncing: tuple[list[tuple[StreamState, int, int, int, bool]], Future] | None = None
        self._commit_thread = ThreadPoolExecutor(1, thread_name_prefix="buffer-commit")
        self._advanced: dict[int, StreamState] = {}  # streams made durable since the last report, by id
        # Faults in the memory of the open segment's RAM slot ahead of its rows (`_populate_ahead`).
        self._populate_thread = ThreadPoolExecutor(1, thread_name_prefix="buffer-populate")
        self._populated: dict[int, int] = {}  # slot -> rows faulted in (once all, the slot's memory stays ours)
        self._ahead_rows = max(1, POPULATE_AHEAD_BYTES // row_bytes(self.schema))
        self._open_batches: list[tuple[int, int, int, bool, str, int]] = []  # durable in the open segment
        self.duplicates = 0
        # Counters, from what the directory holds (a corrupt segment found meanwhile is subtracted).
        self.transitions = 0  # sampleable transitions (own and attached)
        opened = load_existing(self.dir, self.index, self._streams, self.catalog)  # seals what a crash left open
        self.transitions += opened.transitions
        self.records = opened.records  # step records this run's robots produced (own data only)
        self.lost_batches = opened.lost_batches  # batches the edges lost before sending (spool file unreadable)
        self.discarded_rows = opened.discarded_rows  # transitions of discarded episodes (n steps: n - 1)
        self.cache.discard(opened.discarded)
        for stream in list(self._streams.in_ram.values()):
            self._restore_pending(stream)
        self.transitions += attach_history(
            s.attach, self.index.get_meta("spaces"), self.catalog, self._streams.task_code
        )
        fill_cache(self.cache, self.catalog, self.segment_checked)  # newest own first (crc checked), then attached
        # The newest segment id ever used: a corrupt, evicted or unregistered file keeps its name.
        self.open_id = max(
            [
                0,
                *self.catalog.sealed,
                *(r.id for r in self.index.segments(status=None)),
                *(int(p.stem.split("-")[1]) for p in self.dir.glob("*-*.seg")),
            ]
        )
        self._new_open_segment()
        self._pin_hot()
        self.prefetcher = Prefetcher(
            self.cache, self.catalog, self.segment_checked, self.thread_error, s.batches_per_swap
        )
        self.scrubber = Scrubber(self.catalog, self.segment_checked, self.thread_error) if s.scrub else None

    @property
    def failure(self) -> str | None:
        """The disk error that stopped the buffer (None while it takes data)."""
        return self._disk.failure

    @property
    def segments(self) -> dict[int, SegmentRecord]:
        """Sealed, usable segments by id (own and attached; read-only for callers)."""
        return self.catalog.sealed

    @property
    def streams(self) -> dict[tuple[str, int], StreamState]:
        """The streams in RAM by (robot, epoch) (read-only for callers)."""
        return self._streams.in_ram

    # -- streams (ingest thread) ---------------------------------------------------------------------
    # A stream is made by its first batch, released when idle and reloaded from the index on use:
    # see `streams.py`. The store adds what touches its own state: ending episodes, lives.
    def stream(self, robot: str, epoch: int) -> StreamState | None:
        """The stream for (robot, epoch): from RAM, or reloaded from the index if it was released."""
        return self._streams.get(robot, epoch)

    def open_stream(self, robot: str, epoch: int, task: str = "", control_hz: float = 0.0) -> StreamState:
        """The stream for (robot, epoch), made if new. Opening ends no other stream: which older
        lives are over is the ingest's call (`finished_streams`, at a hello). `control_hz`: the robot's
        control rate, kept for exports (a dataset's fps), when the robot has one."""
        if control_hz > 0 and self.index.get_meta(CONTROL_HZ + robot) != repr(float(control_hz)):
            self.index.set_meta({CONTROL_HZ + robot: repr(float(control_hz))})
        return self._streams.open(robot, epoch, task)

    def control_rates(self) -> dict[str, float]:
        """Each robot's control rate, as its streams were opened (robots without one are left out)."""
        return self.index.control_rates()

    def unstored_stream(self, robot: str, epoch: int, task: str = "") -> StreamState:
        """A stand-in for a stream nothing was stored in yet (a hello, an announced epoch): kept
        nowhere, no id (negative), no index row. The first batch makes the real one (`open_stream`),
        so hellos that are never followed by data cost nothing."""
        return self._streams.unstored(robot, epoch, task)

    def stream_positions(self, robot: str, epochs: list[int]) -> dict[int, tuple[int, int]]:
        """(durable seq, last seq) of each of the robot's `epochs`, without loading any: (0, 0) for
        one never stored."""
        return self._streams.positions(robot, epochs)

    def last_seq(self, robot: str, epoch: int) -> int:
        state = self.stream(robot, epoch)
        return state.record.last_seq if state else 0

    def finished_streams(
        self, robot: str, epoch: int, spooled: Collection[int], more_spooled: bool = False
    ) -> list[StreamState]:
        """At a hello of `epoch`: the robot's older streams with an open episode whose data has all
        arrived (see `StreamRegistry.finished`)."""
        return self._streams.finished(robot, epoch, spooled, more_spooled)

    def release_stream(self, stream: StreamState) -> bool:
        """Drop a stream from RAM (its record stays in the index; `stream()` reloads it).

        True when dropped now; False when it still has data in the open segment: it is then
        dropped when that segment is sealed, unless it is used again before."""
        return self._streams.release(stream)

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
            with self._disk.writing("end an episode"):
                self.index.update_episodes(list(stream.episodes.values()))

    def _unsealed(self, stream: StreamState) -> bool:
        """Whether the stream has batches not yet sealed (pending a commit, or in the open segment)."""
        sid = stream.record.id
        syncing = self._syncing[0] if self._syncing is not None else []
        return (
            any(p[0] is stream for p in self._pending_commits)
            or any(p[0] is stream for p in syncing)
            or any(b[0] == sid for b in self._open_batches)
        )

    def _restore_pending(self, stream: StreamState) -> None:
        restore_pending(stream, self.catalog, self.segment_checked)

    # -- writing -----------------------------------------------------------------------------------
    def add(self, stream: StreamState, seq: int, cols: dict[str, np.ndarray], people: Sequence[str] = ()) -> bool:
        """Append one validated batch (seq must follow the stream's last); False if a duplicate.
        `people`: the names its person columns refer to (`wire/transitions.PEOPLE`); new ones are
        recorded in the index before a row is written (`people.py`).

        All or nothing: if it raises, the stream is as before the call (and after a disk error,
        BufferWriteError, the buffer takes no more data)."""
        self._disk.check_writable()
        if seq <= stream.record.last_seq:
            self.duplicates += 1
            return False
        with self._disk.writing("name people"):
            cols = self.people.stored(cols, people)
        saved = stream.snapshot(np.unique(cols["episode"]).tolist())
        try:
            with self._disk.writing("append"):
                for part in _split(cols, self.segment_rows - 1):
                    needed = len(part["reward"]) + len(part.get(FINAL_ROW, ())) + 1
                    if needed > self.writer.remaining:
                        self.seal()
                    base = self.writer.rows
                    rows = layout(part, stream, self.open_id, base, self.schema)
                    self.writer.append(rows)
                    with self._lock:
                        self.transitions += self.cache.append(self.open_slot, base, rows)
        except BaseException:
            stream.restore(saved)
            raise
        n = len(cols["reward"])
        stream.record.last_seq = seq
        stream.records += n
        self.records += n
        self._pending_commits.append((stream, seq, n, self.writer.rows, False))
        self._populate_ahead()
        return True

    def record_lost(self, stream: StreamState, seq: int, counted: bool = True) -> bool:
        """The edge lost batch `seq` (its spool file was unreadable): the stream moves past it.

        The record waiting for a successor gets none; the seq becomes durable at the next commit
        like a batch (a re-send of it is a duplicate). False if `seq` is not past the last one.
        `counted=False` takes a seq that carries no rows on purpose (an episode-end marker)."""
        self._disk.check_writable()
        if seq <= stream.record.last_seq:
            self.duplicates += 1
            return False
        stream.dropped += int(stream.pending is not None)
        stream.pending, stream.pending_at = None, None
        stream.record.last_seq = seq
        self._pending_commits.append((stream, seq, 0, self.writer.rows, counted))
        if not counted:
            return True
        self.lost_batches += 1
        log.warning(
            "robot %s (epoch %d) lost batch %d before sending it", stream.record.robot, stream.record.epoch, seq
        )
        return True

    def commit(self) -> list[StreamState]:
        """Make every appended batch durable now; return the streams whose durable seq advanced
        since the last report (a group commit of the commit thread still running is waited for)."""
        self._commit_now()
        return self._take_durable()

    def _commit_now(self) -> None:
        """`commit` without the report: a seal commits first, and what that made durable is still
        reported by the ingest's next `commit` / `finish_commit` (so it acks it then)."""
        self._collect(wait=True)
        self._disk.check_writable()
        if not self._pending_commits:
            return
        pending, self._pending_commits = self._pending_commits, []
        with self._disk.writing("commit"):
            self._sync(self.writer, self.commits, self._commit_records(pending))
        self._durable(pending)

    def start_commit(self) -> bool:
        """Begin making every batch appended so far durable on the commit thread (the same steps as
        `commit`), so the ingest thread goes on taking batches while the disk syncs; `finish_commit`
        says when it is done. False (nothing started) while one runs or when nothing is pending."""
        self._disk.check_writable()
        if self._syncing is not None or not self._pending_commits:
            return False
        pending, self._pending_commits = self._pending_commits, []
        records = self._commit_records(pending)  # made here: the streams' records change on this thread
        self._syncing = (pending, self._commit_thread.submit(self._sync, self.writer, self.commits, records))
        return True

    @property
    def commit_running(self) -> bool:
        """Whether a group commit is running on the commit thread (`start_commit`)."""
        return self._syncing is not None

    def finish_commit(self, wait: bool = False) -> list[StreamState]:
        """The streams whose durable seq advanced since the last report: by the group commit
        `start_commit` began, once it is done (`wait`: wait for it), or by a seal meanwhile; [] when
        none did. A group commit's disk error is raised here (as BufferWriteError: the buffer stops
        taking data, nothing of it is acked)."""
        self._collect(wait)
        return self._take_durable()

    def _collect(self, wait: bool) -> None:
        """Take in the running group commit once it is done (`wait`: wait for it)."""
        if self._syncing is None or not (wait or self._syncing[1].done()):
            return
        pending, done = self._syncing
        self._syncing = None
        with self._disk.writing("commit"):
            done.result()
        self._durable(pending)

    @staticmethod
    def _commit_records(pending: list[tuple[StreamState, int, int, int, bool]]) -> list[bytes]:
        """One commit-log record per batch: what recovery keeps of the open segment after a crash."""
        return [
            json.dumps(
                {
                    "s": stream.record.id,
                    "r": stream.record.robot,
                    "e": stream.record.epoch,
                    "t": stream.record.task,
                    "q": seq,
                    "n": records,
                    "end": end,
                    "lost": lost,
                }
            ).encode()
            for stream, seq, records, end, lost in pending
        ]

    @staticmethod
    def _sync(writer: SegmentWriter, commits: CommitLog, records: list[bytes]) -> None:
        """The rows first, then the records that say they are there (a record never gets to disk
        before its rows). On an error the records that were not synced are cut off the log again:
        they were never acked and must not come back after a restart."""
        size = commits.size
        try:
            writer.sync()
            for record in records:
                commits.append(record)
            commits.sync()
        except OSError:
            commits.truncate(size)
            raise

    def _durable(self, pending: list[tuple[StreamState, int, int, int, bool]]) -> None:
        """These batches are on disk: their streams' durable seqs advance (acked means durable), and
        the streams are reported at the next `commit` / `finish_commit`."""
        for stream, seq, records, _end, lost in pending:
            rec = stream.record
            self._open_batches.append((rec.id, seq, records, lost, rec.robot, rec.epoch))
            stream.durable_seq = max(stream.durable_seq, seq)
            self._advanced[rec.id] = stream

    def _take_durable(self) -> list[StreamState]:
        advanced, self._advanced = list(self._advanced.values()), {}
        return advanced

    def seal(self) -> None:
        """Seal the open segment (if it holds rows), register it, and open a fresh one."""
        self._commit_now()  # what it makes durable is reported (acked) at the next commit or finish_commit
        with self._disk.writing("seal"):
            if self.writer.rows == 0:
                if self._open_batches:  # only row-less batches (lost, markers): the index still learns of them
                    self._register(None, {})
                self._streams.release_deferred()
                return
            segment_id, rows = self.open_id, self.writer.rows
            columns = {n: a[self.open_slot] for n, a in self.cache.arrays.items()}  # the ingest's own slot
            info = self.writer.seal(segment_file(self.dir, segment_id))
            record = self._segment_record(segment_id, info.path, rows, info.nbytes, columns)
            self._register(record, columns)
            self.commits.close()
            commit_file(self.dir, segment_id).unlink(missing_ok=True)
            with self._lock:
                self.catalog.verified.add(segment_id)
                sealed = self.cache.info[self.open_slot]
                sealed.pinned, sealed.loaded_at = False, time.monotonic()  # in RAM from now, like a fresh load
                self._pin_hot()  # before a slot is freed for the next open segment: the new one is hot
            self._new_open_segment()
            with self._lock:
                self._pin_hot()
            self._evict_for_disk()
        self._streams.release_deferred()

    def _segment_record(self, segment_id: int, path: Path, rows: int, nbytes: int, columns: dict) -> SegmentRecord:
        kind, version = columns["kind"][:rows], columns["policy_version"][:rows]
        records = kind == KIND_RECORD
        return SegmentRecord(
            segment_id,
            path.name,
            rows,
            int(records.sum()),
            int(np.count_nonzero(self.cache.next_row[self.cache.slot_of(segment_id)][:rows] >= 0)),
            nbytes,
            time.time(),
            int(version[records].min(initial=2**62)),
            int(version[records].max(initial=-1)),
            int(np.count_nonzero(intervened(columns["actor"][:rows][records]))),
            "online",
        )

    def _register(self, record: SegmentRecord | None, columns: dict) -> None:
        touched = {b[0] for b in self._open_batches}
        streams = [s for s in self._streams.in_ram.values() if s.record.id in touched]
        if record is not None:
            for stream in streams:  # where the stream's last record lives (to continue its episode after a restart)
                mine = np.flatnonzero(
                    (columns["stream"][: record.rows] == stream.record.id)
                    & (columns["kind"][: record.rows] == KIND_RECORD)
                )
                if len(mine):
                    stream.record.last_segment, stream.record.last_row = record.id, int(mine[-1])
        episodes = [
            ep for s in streams for ep in s.episodes.values() if record is not None and ep.last_segment == record.id
        ]
        batches = [(sid, seq, n) for sid, seq, n, lost, _, _ in self._open_batches if not lost]
        lost = [(sid, seq, self.open_id) for sid, seq, _, is_lost, _, _ in self._open_batches if is_lost]
        self.index.register_segment(record, batches, [s.record for s in streams], episodes, lost)
        if record is not None:
            self.catalog.add(record)
        self._open_batches = []
        for s in streams:  # finished episodes are in the index now; keep only open ones in RAM
            s.episodes = {n: ep for n, ep in s.episodes.items() if ep.status == "open"}

    def _new_open_segment(self) -> None:
        """Files for the next open segment (disk work, outside the lock), then its RAM slot."""
        self.open_id += 1
        writer = SegmentWriter(segment_file(self.dir, self.open_id, open_=True), self.schema, self.segment_rows)
        commits = CommitLog(commit_file(self.dir, self.open_id))
        with self._lock:
            slot = self.cache.free_slot()
            if slot is None:
                slot = self._victim()
                self.cache.release(slot)
            self.cache.open(slot, self.open_id)
            self.open_slot, self.writer, self.commits = slot, writer, commits

    def _populate_ahead(self) -> None:
        """Have the populate thread fault in the open slot's memory up to POPULATE_AHEAD_BYTES past
        its last row. A slot that never held a segment has no memory yet (np.zeros maps it lazily),
        and the ingest's copies would otherwise fault it in page by page on the ingest thread: until
        the RAM budget has been used once, that was the biggest cost of taking a batch. Only ahead of
        data that arrives, so an idle learner takes no RAM for it."""
        slot, rows, capacity = self.open_slot, self.writer.rows, self.segment_rows
        done = self._populated.get(slot, 0)
        if done >= capacity or done >= rows + self._ahead_rows:
            return
        start, end = max(done, rows), min(capacity, rows + 2 * self._ahead_rows)
        self._populated[slot] = end
        self._populate_thread.submit(self.cache.populate, slot, start, end)

    def _pin_hot(self) -> None:
        """Pin the open segment and the newest sealed ones, leaving at least one slot to rotate."""
        own = self.catalog.own()
        keep = min(self.settings.hot_segments, self.cache.slots - 3)  # minus the spare, open, rotating slot
        hot = set(own[-keep:]) if keep > 0 else set()
        for slot in self.cache.active():
            info = self.cache.info[slot]
            info.pinned = info.segment == self.open_id or info.segment in hot

    def _victim(self) -> int:
        candidates = [i for i in self.cache.active() if not self.cache.info[i].pinned]
        if not candidates:
            raise RuntimeError("the RAM budget holds no slot that can be freed; raise buffer.ram_budget_mb")
        return min(candidates, key=lambda i: self.cache.info[i].loaded_at)

    def _evict_for_disk(self) -> None:
        """Over the disk limit: drop the oldest segments that hold only online robot data.

        The index says "evicted" before a file is deleted: a crash in between leaves a file
        nobody uses (deleted at the next open), never an index entry without its file."""
        limit = self.settings.max_disk_gb * 2**30
        if not limit:
            return
        own = [self.catalog.sealed[i] for i in self.catalog.own()]
        used = sum(r.bytes for r in own)
        evicted = []
        for record in own[:-1]:
            if used <= limit:
                break
            if record.intervention_rows or record.source != "online":
                continue
            used -= record.bytes
            evicted.append(record)
        if not evicted:
            return
        with self._lock:
            for record in evicted:
                slot = self.cache.slot_of(record.id)
                if slot is not None:
                    self.cache.release(slot)
                self.transitions -= record.transitions
                self.catalog.evict(record.id)
        self.index.set_segment_status([r.id for r in evicted], "evicted")
        for record in evicted:
            try:
                (self.dir / record.file).unlink(missing_ok=True)
            except OSError as error:  # the index already says evicted: the next open deletes it
                log.warning("evicted segment %s could not be deleted yet: %s", record.file, error)
        log.info("buffer over %.1f GB: evicted %d oldest segments", self.settings.max_disk_gb, len(evicted))

    # -- integrity (any thread) ----------------------------------------------------------------------
    def segment_checked(self, segment_id: int, problem: CorruptSegment | None) -> None:
        """A segment's crc was checked (first load or scrub): remember it, or drop it if corrupt."""
        with self._lock:
            record = self.catalog.checked(segment_id, problem)
            if record is None:
                return
            slot = self.cache.slot_of(segment_id)
            if slot is not None:
                self.cache.release(slot)
            self.transitions -= record.transitions
        log.warning("skipping %s", problem)
        self.index.set_segment_status([segment_id], "corrupt")

    def thread_error(self, thread: str, error: BaseException) -> None:
        """A background thread's unexpected error (logged with its traceback by the caller)."""
        self._thread_errors[thread] = f"{type(error).__name__}: {error}"

    def thread_errors(self) -> dict[str, str]:
        """Errors of the buffer's background threads (prefetch, scrub), by thread."""
        return dict(self._thread_errors)

    # -- sampling ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Transitions that can be sampled (what `algo.learning_starts` counts): stored ones, less
        those of discarded episodes."""
        return max(0, self.transitions - self.discarded_rows)

    @property
    def idle_weight(self) -> float:
        """What a step flagged idle (a person drove and held nothing) counts as a demonstration, against
        another step: 1 (`idle_rows: keep`), `idle_weight` (downweight) or 0 (drop). The sampler draws
        idle rows that much as often; an idle step inside a drawn row's chunk weighs that much
        (`cloud/batches.training_columns`)."""
        return {"keep": 1.0, "downweight": self.settings.idle_weight, "drop": 0.0}[self.settings.idle_rows]

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A batch: obs/*, next_obs/*, action, reward, terminated, policy_version, robot, who acted
        (actor), whether they held nothing (idle) and what the policy proposed (policy_action), label
        and label_by (+ discount).

        With `action_horizon` H > 1 also each row's next H executed actions in its episode:
        action_chunk (B, H, ...), chunk_mask (B, H; False past the episode's end, where the chunk
        repeats the last real action), chunk_actor (who executed each), chunk_idle (whether its
        person held nothing) and chunk_step (each one's index in the policy's chunk that proposed it)."""
        with self._lock:
            self.prefetcher.install_ready()
            cache = self.cache
            if not len(cache.plan):
                self.prefetcher.wanted()  # what is in RAM has nothing to draw: rotate a cold segment in
                if cache.drop_stale and cache.catalog_size() == 0 and self.transitions:
                    raise AllStale(
                        f"every cached transition lagged more than buffer.max_policy_lag="
                        f"{self.settings.max_policy_lag} versions (stale_data: drop)"
                    )
                raise NothingToSample(
                    f"{EMPTY} (in RAM now: {cache.catalog_size()} transitions, none the "
                    f"sampler may draw; {len(self)} sampleable in the buffer)"
                )
            position = cache.plan.draw(batch_size, rng)  # flat positions in the slot arrays
            self._redraw_downweighted(position, rng)
            flat = self.cache.flat
            n, horizon = self.settings.n_step, self.settings.action_horizon
            # one walk serves both: a shorter walk is a prefix of a longer one
            rows, steps = self.cache.walk(position, max(n, horizon)) if max(n, horizon) > 1 else (None, None)
            if n > 1:
                reward, discount, terminated, nxt = self.cache.n_step(rows[:, :n], np.minimum(steps, n), self.gamma)
            else:
                reward, terminated = flat["reward"][position], flat["terminated"][position]
                nxt = self.cache.successor(position)
            batch = {OBS + k: flat[OBS + k][position] for k in self.obs_keys}
            batch.update({NEXT_OBS + k: flat[OBS + k][nxt] for k in self.obs_keys})
            batch["action"] = flat["action"][position]
            batch["reward"], batch["terminated"] = reward, terminated
            batch["policy_version"] = flat["policy_version"][position]
            batch["robot"] = flat["stream"][position]
            for name in ("actor", IDLE, POLICY_ACTION, "label", "label_by"):
                batch[name] = flat[name][position]
            if n > 1:
                batch["discount"] = discount
            if horizon > 1:
                rows, steps = rows[:, :horizon], np.minimum(steps, horizon)
                batch["action_chunk"] = flat["action"][rows]
                batch["chunk_mask"] = np.arange(horizon) < steps[:, None]
                batch["chunk_actor"], batch["chunk_step"] = flat["actor"][rows], flat["chunk_step"][rows]
                batch["chunk_" + IDLE] = flat[IDLE][rows]
        self.prefetcher.sampled()
        return batch

    def _redraw_downweighted(self, picked: np.ndarray, rng: np.random.Generator) -> None:
        """Down-weight stale transitions (`stale_data: downweight`) and idle ones (`idle_rows:
        downweight`) by rejection: each drawn one is kept with probability `stale_weight` (stale),
        `idle_weight` (idle), their product (both), else its place is drawn again. A draw lays its rows
        out by source the same way every time, so a redrawn place keeps its source. After `REDRAWS`
        rounds what is left stays (only a buffer of almost nothing but such rows gets there)."""
        s = self.settings
        stale = s.max_policy_lag is not None and s.stale_data == "downweight"
        idle = s.idle_rows == "downweight"
        if not stale and not idle:
            return
        undecided = np.ones(len(picked), bool)  # places whose draw has not been kept or rejected yet
        for _ in range(REDRAWS):
            keep = np.ones(len(picked))
            if stale:
                keep[self.cache.stale[picked]] *= s.stale_weight
            if idle:
                keep[self.cache.flat[IDLE][picked]] *= s.idle_weight
            rejected = undecided & (rng.random(len(picked)) >= keep)
            if not rejected.any():
                return
            picked[rejected] = self.cache.plan.draw(len(picked), rng)[rejected]
            undecided = rejected

    # -- inspection and shutdown ---------------------------------------------------------------
    def batch_keys(self) -> set[tuple[str, int, int]]:
        """Every durable (robot, epoch, seq) batch this buffer holds (lost ones: `lost_keys`)."""
        keys = set(self.index.batch_keys())
        keys.update((robot, epoch, seq) for _, seq, _, lost, robot, epoch in self._open_batches if not lost)
        return keys

    def lost_keys(self) -> set[tuple[str, int, int]]:
        """Every durable (robot, epoch, seq) that an edge reported lost."""
        keys = set(self.index.lost_keys())
        keys.update((robot, epoch, seq) for _, seq, _, lost, robot, epoch in self._open_batches if lost)
        return keys

    def stats(self) -> dict:
        dropped_unpaired = self._streams.dropped_unpaired()
        with self._lock:
            return {
                "transitions": self.transitions,
                "segments": len(self.catalog.sealed) + 1,
                "cached_segments": len(self.cache.active()),
                "corrupt_segments": list(self.catalog.corrupt),
                "duplicates": self.duplicates,
                "lost_batches": self.lost_batches,
                "discarded_episodes": len(self.cache.discarded),
                "dropped_unpaired": dropped_unpaired,
                "scrub": self.catalog.scrub_progress(),
                "failure": self.failure,
                "people": len(self.people.names),  # named in the rows (`people.py`)
                "unnamed_person_rows": self.people.unnamed_rows,  # past the buffer's MAX_PEOPLE names
                "thread_errors": self.thread_errors(),
            }

    def close(self) -> None:
        """Seal what is open and close the index; the directory then holds everything.

        After a write failure nothing more is written: the open segment and its commit log stay
        for the next open to recover. Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        if self._syncing is not None:  # a group commit still runs: let it end before the files close
            try:
                self._collect(wait=True)
            except BufferWriteError:
                pass  # latched: the next open recovers what the commit log holds
        self._commit_thread.shutdown()
        self._populate_thread.shutdown(cancel_futures=True)
        self.prefetcher.close()
        if self.scrubber is not None:
            self.scrubber.close()
        if self.failure is None:
            try:
                self.seal()
            except BufferWriteError:
                pass  # logged; the next open recovers what the commit log holds
        if self.failure is not None:
            self.writer.close()
            self.commits.close()
            self.index.close()
            return
        self.writer.abort()
        self.commits.close()
        commit_file(self.dir, self.open_id).unlink(missing_ok=True)
        streams = self._streams.in_ram.values()
        self.index.update_episodes([ep for s in streams for ep in s.episodes.values()], [s.record for s in streams])
        self.index.close()


def _split(cols: dict[str, np.ndarray], max_rows: int) -> list[dict[str, np.ndarray]]:
    """Cut a batch into parts whose records plus final observations fit in one segment."""
    n = len(cols["reward"])
    final_rows = cols.get(FINAL_ROW, np.zeros(0, np.int64))
    if n + len(final_rows) <= max_rows:
        return [cols]
    parts, start = [], 0
    step = max(1, max_rows // 2)
    while start < n:
        end = min(n, start + step)
        in_part = (final_rows >= start) & (final_rows < end)
        part = {k: v[start:end] for k, v in cols.items() if k != FINAL_ROW and not k.startswith(FINAL_OBS)}
        part[FINAL_ROW] = final_rows[in_part] - start
        for k, v in cols.items():
            if k.startswith(FINAL_OBS):
                part[k] = v[in_part]
        parts.append(part)
        start = end
    return parts
