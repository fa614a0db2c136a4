"""The persistent replay buffer: what the ingest appends to and the learner samples from.

Write path: a batch is laid out as rows (`rows.layout`), written in place into the open
segment file and copied into its RAM slot, so it can be sampled at once. `commit()` makes
everything appended so far durable (fdatasync of the segment, then one commit-log record per
batch, fsynced) and reports which streams advanced, so the ingest can acknowledge them. A full
segment is sealed (crc, fsync, rename) and registered in the SQLite index in one transaction.

Read path: the sampler draws from the catalog of cached transitions; a batch is one numpy
gather over the slot arrays. Data larger than the RAM budget is rotated through the cache by
the prefetcher (`prefetch.py`), so sampling never waits on disk.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from user_rl.cloud.buffer.cache import SlotCache
from user_rl.cloud.buffer.commitlog import CommitLog
from user_rl.cloud.buffer.index import BufferIndex, SegmentRecord, StreamRecord
from user_rl.cloud.buffer.prefetch import Prefetcher
from user_rl.cloud.buffer.recovery import attach_history, fill_cache, load_existing, open_meta
from user_rl.cloud.buffer.rows import KIND_RECORD, StreamState, layout, row_bytes, segment_schema
from user_rl.cloud.buffer.sampling import SOURCES, Sampler, SamplerSettings
from user_rl.cloud.buffer.segment import SegmentWriter
from user_rl.config import BufferConfig
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import FINAL_OBS, FINAL_ROW, OBS

log = logging.getLogger(__name__)
NEXT_OBS = "next_" + OBS
ONLINE = SOURCES.index("online")


def segment_file(directory: Path, segment: int, open_: bool = False) -> Path:
    return directory / (f"open-{segment:08d}.seg" if open_ else f"seg-{segment:08d}.seg")


def commit_file(directory: Path, segment: int) -> Path:
    return directory / f"open-{segment:08d}.log"


class PersistentReplay:
    def __init__(self, directory: str | Path, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box,
                 settings: BufferConfig | None = None, gamma: float = 0.99) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.settings = s = settings or BufferConfig()
        self.gamma = gamma
        self.obs_keys = sorted(obs_space.spaces)
        self.schema = segment_schema(obs_space, action_space)
        self.index = BufferIndex(self.dir / "index.sqlite")
        self.segment_rows = open_meta(self.index, obs_space, action_space, self.schema, s.segment_mb)
        slot_bytes = self.segment_rows * row_bytes(self.schema)
        self.cache = SlotCache(self.schema, self.segment_rows, max(2, int(s.ram_budget_mb * 2**20 // slot_bytes)))
        self.sampler = Sampler(SamplerSettings(s.strategy, s.recency_half_life, s.mix))
        self.streams: dict[tuple[str, int], StreamState] = {}
        self.robots: dict[str, int] = {}
        self.tasks: dict[str, int] = {}
        self.segments: dict[int, SegmentRecord] = {}    # sealed, usable (own and attached)
        self.attached: dict[int, tuple[Path, int, np.ndarray | None]] = {}  # id -> (file, source, row filter)
        self.corrupt: list[str] = []
        self.duplicates = 0
        self._closed = False
        self._pending_commits: list[tuple[StreamState, int, int, int]] = []  # stream, seq, records, end row
        self._open_batches: list[tuple[int, int, int]] = []  # (stream, seq, records) durable in the open segment
        self._open_records = 0
        self.transitions = 0    # sampleable transitions (own and attached)
        self.records = 0        # step records this run's robots produced (own data only)
        load_existing(self)            # seals what a crash left open, loads streams and segments
        attach_history(self, s.attach)
        fill_cache(self)               # newest own segments first, then attached history
        # The newest segment id ever used: a corrupt, evicted or unregistered file keeps its name.
        self.open_id = max([0, *self.segments, *(r.id for r in self.index.segments(status=None)),
                            *(int(p.stem.split("-")[1]) for p in self.dir.glob("*-*.seg"))])
        self._new_open_segment()
        self._pin_hot()
        self.prefetcher = Prefetcher(self)

    # -- streams -------------------------------------------------------------------------------
    def open_stream(self, robot: str, epoch: int, task: str = "") -> StreamState:
        """The stream for (robot, epoch); a new epoch ends the robot's older streams' open episodes."""
        key = (robot, epoch)
        if key in self.streams:
            return self.streams[key]
        for other in self.streams.values():
            if other.record.robot == robot and other.record.epoch < epoch:  # a stale epoch ends nothing
                self.end_open_episodes(other, reason="edge_restart")
        record = StreamRecord(self._next_stream_id(), robot, epoch, task)
        state = StreamState(record, self.robots.setdefault(robot, len(self.robots)),
                            self.tasks.setdefault(task, len(self.tasks)))
        self.streams[key] = state
        return state

    def _next_stream_id(self) -> int:
        return 1 + max((s.record.id for s in self.streams.values()), default=0)

    def end_open_episodes(self, stream: StreamState, reason: str) -> None:
        """The robot's edge restarted or detached mid-episode: that episode is over, cut short
        (truncated, with the reason), and its last step gets no successor."""
        for ep in stream.episodes.values():
            if ep.status == "open":
                ep.status, ep.end_reason = "truncated", reason
        stream.dropped += int(stream.pending is not None)  # its last record never gets a successor
        stream.pending, stream.pending_at = None, None
        self.index.update_episodes(list(stream.episodes.values()))

    def last_seq(self, robot: str, epoch: int) -> int:
        state = self.streams.get((robot, epoch))
        return state.record.last_seq if state else 0

    # -- writing -----------------------------------------------------------------------------------
    def add(self, stream: StreamState, seq: int, cols: dict[str, np.ndarray]) -> bool:
        """Append one validated batch (seq must follow the stream's last); False if a duplicate."""
        if seq <= stream.record.last_seq:
            self.duplicates += 1
            return False
        for part in _split(cols, self.segment_rows - 1):
            needed = len(part["reward"]) + len(part.get(FINAL_ROW, ())) + 1
            if needed > self.writer.remaining:
                self.seal()
            base = self.writer.rows
            rows = layout(part, stream, self.open_id, base, self.schema)
            self.writer.append(rows)
            self.cache.append(self.open_slot, base, rows)
            self._recount_open()
        stream.record.last_seq = seq
        self.records += len(cols["reward"])
        self._pending_commits.append((stream, seq, len(cols["reward"]), self.writer.rows))
        return True

    def _recount_open(self) -> None:
        open_now = int(np.count_nonzero(self.cache.next_row[self.open_slot] >= 0))
        self.transitions += open_now - self._open_transitions
        self._open_transitions = open_now

    def commit(self) -> list[StreamState]:
        """Make every appended batch durable; return the streams whose durable seq advanced."""
        if not self._pending_commits:
            return []
        self.writer.sync()
        advanced: dict[int, StreamState] = {}
        for stream, seq, records, end in self._pending_commits:
            rec = stream.record
            self.commits.append(json.dumps({"s": rec.id, "r": rec.robot, "e": rec.epoch, "t": rec.task,
                                            "q": seq, "n": records, "end": end}).encode())
            self._open_batches.append((rec.id, seq, records))
            stream.durable_seq = seq
            advanced[rec.id] = stream
        self.commits.sync()
        self._pending_commits.clear()
        return list(advanced.values())

    def seal(self) -> None:
        """Seal the open segment (if it holds rows), register it, and open a fresh one."""
        self.commit()
        if self.writer.rows == 0:
            return
        segment_id, rows = self.open_id, self.writer.rows
        columns = {n: a[self.open_slot] for n, a in self.cache.arrays.items()}
        info = self.writer.seal(segment_file(self.dir, segment_id))
        record = self._segment_record(segment_id, info.path, rows, info.nbytes, columns)
        self._register(record, columns)
        self.commits.close()
        commit_file(self.dir, segment_id).unlink(missing_ok=True)
        sealed = self.cache.info[self.open_slot]
        sealed.pinned, sealed.loaded_at = False, time.monotonic()  # in RAM from now, like a fresh load
        self._pin_hot()  # before a slot is freed for the next open segment: the new one is hot
        self._new_open_segment()
        self._pin_hot()
        self._evict_for_disk()

    def _segment_record(self, segment_id: int, path: Path, rows: int, nbytes: int, columns: dict) -> SegmentRecord:
        kind, version = columns["kind"][:rows], columns["policy_version"][:rows]
        records = kind == KIND_RECORD
        return SegmentRecord(
            segment_id, path.name, rows, int(records.sum()),
            int(np.count_nonzero(self.cache.next_row[self.cache.slot_of(segment_id)][:rows] >= 0)), nbytes, time.time(),
            int(version[records].min(initial=2**62)), int(version[records].max(initial=-1)),
            int(np.count_nonzero(columns["actor"][:rows][records] == pb.ACTOR_HUMAN)), "online")

    def _register(self, record: SegmentRecord, columns: dict) -> None:
        touched = {sid for sid, _, _ in self._open_batches}
        streams = [s for s in self.streams.values() if s.record.id in touched]
        for stream in streams:  # where the stream's last record lives (to continue its episode after a restart)
            mine = np.flatnonzero((columns["stream"][: record.rows] == stream.record.id)
                                  & (columns["kind"][: record.rows] == KIND_RECORD))
            if len(mine):
                stream.record.last_segment, stream.record.last_row = record.id, int(mine[-1])
        episodes = [ep for s in streams for ep in s.episodes.values() if ep.last_segment == record.id]
        self.index.register_segment(record, self._open_batches, [s.record for s in streams], episodes)
        self.segments[record.id] = record
        self._open_batches = []
        for s in streams:  # finished episodes are in the index now; keep only open ones in RAM
            s.episodes = {n: ep for n, ep in s.episodes.items() if ep.status == "open"}

    def _new_open_segment(self) -> None:
        self.open_id += 1
        self.writer = SegmentWriter(segment_file(self.dir, self.open_id, open_=True), self.schema, self.segment_rows)
        self.commits = CommitLog(commit_file(self.dir, self.open_id))
        slot = self.cache.free_slot()
        if slot is None:
            slot = self._victim()
            self.cache.release(slot)
        self.open_slot = slot
        self.cache.info[slot].segment = self.open_id
        self.cache.info[slot].pinned = True
        self.cache.info[slot].rows = 0
        self.cache.refresh(slot)
        self._open_transitions = 0

    def _pin_hot(self) -> None:
        """Pin the open segment and the newest sealed ones, leaving at least one slot to rotate."""
        own = sorted(i for i in self.segments if i not in self.attached)
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
        """Over the disk limit: delete the oldest segments that hold only online robot data."""
        limit = self.settings.max_disk_gb * 2**30
        if not limit:
            return
        own = [r for i, r in sorted(self.segments.items()) if i not in self.attached]
        used = sum(r.bytes for r in own)
        evicted = []
        for record in own[:-1]:
            if used <= limit:
                break
            if record.intervention_rows or record.source != "online":
                continue
            slot = self.cache.slot_of(record.id)
            if slot is not None:
                self.cache.release(slot)
            (self.dir / record.file).unlink(missing_ok=True)
            used -= record.bytes
            self.transitions -= record.transitions
            del self.segments[record.id]
            evicted.append(record.id)
        if evicted:
            self.index.set_segment_status(evicted, "evicted")
            log.info("buffer over %.1f GB: evicted %d oldest segments", self.settings.max_disk_gb, len(evicted))

    # -- sampling ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.transitions

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A batch: obs/*, next_obs/*, action, reward, terminated, policy_version, robot (+ discount)."""
        self.prefetcher.install_ready()
        catalog = self.cache.catalog()
        picked = self.sampler.draw(catalog["order"], catalog["source"], catalog["task"],
                                   batch_size, rng, self.cache.version)
        position = catalog["position"][picked]
        flat = self.cache.flat
        if self.settings.n_step > 1:
            reward, discount, terminated, nxt = self.cache.n_step(position, self.settings.n_step, self.gamma)
        else:
            reward, terminated, nxt = flat["reward"][position], flat["terminated"][position], self.cache.successor(position)
        batch = {OBS + k: flat[OBS + k][position] for k in self.obs_keys}
        batch.update({NEXT_OBS + k: flat[OBS + k][nxt] for k in self.obs_keys})
        batch["action"] = flat["action"][position]
        batch["reward"], batch["terminated"] = reward, terminated
        batch["policy_version"] = flat["policy_version"][position]
        batch["robot"] = flat["stream"][position]
        if self.settings.n_step > 1:
            batch["discount"] = discount
        self.prefetcher.sampled()
        return batch

    # -- inspection and shutdown ---------------------------------------------------------------
    def batch_keys(self) -> set[tuple[str, int, int]]:
        """Every durable (robot, epoch, seq) this buffer holds."""
        keys = set(self.index.batch_keys())
        by_id = {s.record.id: s.record for s in self.streams.values()}
        keys.update((by_id[sid].robot, by_id[sid].epoch, seq) for sid, seq, _ in self._open_batches)
        return keys

    def stats(self) -> dict:
        return {"transitions": self.transitions, "segments": len(self.segments) + 1,
                "cached_segments": len(self.cache.active()), "corrupt_segments": list(self.corrupt),
                "duplicates": self.duplicates,
                "dropped_unpaired": sum(s.dropped for s in self.streams.values())}

    def close(self) -> None:
        """Seal what is open and close the index; the directory then holds everything.

        Closing twice is harmless (a learner and its test fixture may both close)."""
        if self._closed:
            return
        self._closed = True
        self.prefetcher.close()
        self.seal()
        self.writer.abort()
        self.commits.close()
        commit_file(self.dir, self.open_id).unlink(missing_ok=True)
        self.index.update_episodes([ep for s in self.streams.values() for ep in s.episodes.values()],
                                   [s.record for s in self.streams.values()])
        self.index.close()

    # -- STAND-IN (protocol branch, issue 10): the buffer branch implements record_lost for real
    # (counted in stats as lost_batches, recovery-safe). Drop this method when merging that one.
    def record_lost(self, stream: StreamState, seq: int, counted: bool = True) -> None:
        """Take `seq` with no rows (a batch the edge lost, or an episode-end marker when not
        `counted`): durable at the next commit; nothing pairs across it."""
        if seq <= stream.record.last_seq:
            return
        stream.dropped += int(stream.pending is not None)
        stream.pending, stream.pending_at = None, None
        stream.record.last_seq = seq
        self._pending_commits.append((stream, seq, 0, self.writer.rows))


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
