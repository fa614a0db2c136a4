"""Opening a buffer directory: seal what a crash left open, load streams, attach history.

A crash can leave an open segment with its commit log: the rows the log records as committed
are durable (they were acknowledged), the rest was never acknowledged and the edges re-send
it. Those rows are sealed into a normal segment and registered. Opening reads no segment in
full: a sealed segment's crc is checked when it is first loaded into RAM (here for the newest
ones, later by the prefetcher) or by the background scrub; a torn or corrupted one is skipped
and reported, never sampled.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from user_rl.cloud.buffer.commitlog import CommitLog
from user_rl.cloud.buffer.index import BufferIndex, SegmentRecord, StreamRecord
from user_rl.cloud.buffer.rows import KIND_CARRY, KIND_RECORD, StreamState, account, row_bytes, successors
from user_rl.cloud.buffer.sampling import SOURCES
from user_rl.cloud.buffer.segment import CorruptSegment, read_segment, seal_open_file
from user_rl.wire.spaces import same_spaces, spaces_from_text, spaces_to_text
from user_rl.wire.transitions import DISCARD, intervened

if TYPE_CHECKING:
    from user_rl.cloud.buffer.store import PersistentReplay
    from user_rl.config import AttachConfig

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 5.0  # long opens and scrubs log how far they are


def open_meta(
    index: BufferIndex, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, schema: dict, segment_mb: float
) -> int:
    """Check (or record) the buffer's spaces; return its rows per segment."""
    spaces = spaces_to_text(obs_space, action_space)["hello_hex"]
    stored = index.get_meta("spaces")
    if stored is None:
        rows = int(min(65536, max(256, segment_mb * 2**20 // row_bytes(schema))))
        index.set_meta({"spaces": spaces, "segment_rows": str(rows), "format": "1"})
        return rows
    if not same_spaces({"hello_hex": stored}, obs_space, action_space):
        obs, act = spaces_from_text({"hello_hex": stored})
        raise ValueError(
            f"the buffer at {index.path.parent} holds observations {obs} and actions {act}; "
            "this fleet's spaces differ: use a new run directory"
        )
    return int(index.get_meta("segment_rows"))


def load_existing(store: PersistentReplay) -> None:
    """Streams, sealed segments and leftovers of a crash, from the buffer directory."""
    index = store.index
    open_episodes: dict[int, dict] = {}
    discarded = []
    for ep in index.episodes():
        if ep.status == "open":
            open_episodes.setdefault(ep.stream, {})[ep.episode] = ep
        elif ep.end_reason == DISCARD:
            discarded.append((ep.stream, ep.episode))
            store.discarded_rows += max(ep.length - 1, 0)
    store.cache.discard(discarded)
    records = index.stream_records()
    for record in index.streams():
        state = store.adopt_stream(record)
        state.episodes = open_episodes.get(record.id, {})
        state.records = records.get(record.id, 0)
    store._max_stream_id = max(store._max_stream_id, index.max_stream_id())
    for record in index.segments():
        store.segments[record.id] = record
        store.transitions += record.transitions
    store.records = sum(r.records for r in index.segments(status=None))  # evicted ones were produced too
    store.lost_batches = index.lost_count()
    _delete_evicted_files(store)
    for open_path in sorted(store.dir.glob("open-*.seg")) + sorted(store.dir.glob("open-*.log")):
        if open_path.exists():
            _recover_open(store, int(open_path.stem.split("-")[1]))
    for stream in store.streams.values():
        _restore_pending(store, stream)
    if store.segments:
        log.info("buffer %s: %d segments, %d transitions", store.dir, len(store.segments), store.transitions)


def load_stream(store: PersistentReplay, record: StreamRecord) -> StreamState:
    """A stream released from RAM, back from the index: open episodes, records, pending record."""
    state = store.adopt_stream(record)
    state.episodes = {ep.episode: ep for ep in store.index.episodes(record.id) if ep.status == "open"}
    state.records = store.index.stream_records(record.id).get(record.id, 0)
    _restore_pending(store, state)
    return state


def _delete_evicted_files(store: PersistentReplay) -> None:
    """Eviction marks the index first, then deletes: a crash in between leaves the file behind."""
    for record in store.index.segments(status="evicted"):
        path = store.dir / record.file
        if path.exists():
            path.unlink()
            log.info("deleted %s, evicted before the last shutdown", record.file)


def fill_cache(store: PersistentReplay) -> None:
    """Newest own segments into RAM first, then attached history; the rest waits for the prefetcher.

    Each own segment's crc is checked as it is loaded (it is read in full anyway)."""
    own = sorted((i for i in store.segments if i not in store.attached), reverse=True)
    wanted = own + sorted(store.attached, reverse=True)
    last_report = time.monotonic()
    for done, segment_id in enumerate(wanted):
        slot = store.cache.free_slot()
        if slot is None or len(store.cache.active()) >= store.cache.slots - 2:  # keep one for the open segment
            break
        try:
            _fill(store, slot, segment_id, verify=segment_id not in store.verified)
        except CorruptSegment as problem:
            store.segment_checked(segment_id, problem)
            continue
        store.segment_checked(segment_id, None)
        if time.monotonic() - last_report > PROGRESS_EVERY_S:
            last_report = time.monotonic()
            log.info("buffer: loaded %d/%d segments into RAM (crc checked)", done + 1, len(wanted))


def _recover_open(store: PersistentReplay, segment_id: int) -> None:
    """Seal the committed rows of a segment a crash left open, and register them."""
    open_path = store.dir / f"open-{segment_id:08d}.seg"
    log_path = store.dir / f"open-{segment_id:08d}.log"
    final = store.dir / f"seg-{segment_id:08d}.seg"
    records = [json.loads(p) for p in CommitLog.read(log_path)[0]]
    if segment_id in store.segments or not records:
        open_path.unlink(missing_ok=True)
        log_path.unlink(missing_ok=True)
        return
    try:
        if open_path.exists():
            seal_open_file(open_path, max(r["end"] for r in records), final)
        segment = read_segment(final)
    except CorruptSegment as problem:
        store.corrupt.append(str(problem))
        log.warning("could not recover %s", problem)
        return
    columns, rows = segment.columns, segment.rows
    batches, lost = [], []
    for r in records:
        stream = store.stream(r["r"], r["e"]) or store.adopt_stream(StreamRecord(r["s"], r["r"], r["e"], r["t"]))
        stream.record.last_seq = stream.durable_seq = max(stream.record.last_seq, r["q"])
        if r.get("lost"):
            lost.append((stream.record.id, r["q"], segment_id))
            store.lost_batches += 1
        else:
            batches.append((stream.record.id, r["q"], r["n"]))
            stream.records += r["n"]
    touched = {b[0] for b in batches + lost}
    streams = [s for s in store.streams.values() if s.record.id in touched]
    for stream in streams:
        mine = (columns["stream"][:rows] == stream.record.id) & (columns["kind"][:rows] == KIND_RECORD)
        # An episode the index already has as ended (an edge restart cut it, then this crash) keeps
        # its record: accounting its rows again would reopen it.
        ended = [ep.episode for ep in store.index.episodes(stream.record.id) if ep.status != "open"]
        counted = mine & ~np.isin(np.asarray(columns["episode"][:rows]), ended)
        picked = {
            k: np.asarray(columns[k][:rows][counted])
            for k in ("episode", "policy_version", "reward", "actor", "terminated", "truncated", "label")
        }
        if len(picked["episode"]):
            account(picked, stream, picked["terminated"] | picked["truncated"], segment_id)
        if mine.any():
            stream.record.last_segment, stream.record.last_row = segment_id, int(np.flatnonzero(mine)[-1])
    transitions = int(np.count_nonzero(successors(np.asarray(columns["prev_row"]), rows) >= 0))
    kind, version = np.asarray(columns["kind"]), np.asarray(columns["policy_version"])
    recs = kind == KIND_RECORD
    record = SegmentRecord(
        segment_id,
        final.name,
        rows,
        int(recs.sum()),
        transitions,
        segment.nbytes,
        time.time(),
        int(version[recs].min(initial=2**62)),
        int(version[recs].max(initial=-1)),
        int(np.count_nonzero(intervened(np.asarray(columns["actor"])[recs]))),
        "online",
    )
    episodes = [ep for s in streams for ep in s.episodes.values() if ep.last_segment == segment_id]
    store.index.register_segment(record, batches, [s.record for s in streams], episodes, lost)
    store.segments[segment_id] = record
    store.verified.add(segment_id)
    store.transitions += transitions
    store.records += record.records
    log_path.unlink(missing_ok=True)
    log.warning(
        "recovered %d committed batches (%d rows) of segment %d left open by a crash", len(batches), rows, segment_id
    )


def _restore_pending(store: PersistentReplay, stream: StreamState) -> None:
    """The stream's last record, if its episode goes on, so the next batch continues it."""
    record = stream.record
    if record.last_segment not in store.segments or record.last_row is None:
        return
    try:
        seg = read_segment(store.dir / store.segments[record.last_segment].file, verify=False)
    except CorruptSegment as problem:  # its episode cannot be continued: the next batch starts unpaired
        store.segment_checked(record.last_segment, problem)
        return
    row = {k: np.array(v[record.last_row : record.last_row + 1]) for k, v in seg.columns.items()}
    episode = stream.episodes.get(int(row["episode"][0]))  # only open episodes are loaded
    if row["terminated"][0] or row["truncated"][0] or episode is None or episode.status != "open":
        return  # ended, or cut short by an edge restart: nothing may follow it
    row["kind"][:] = KIND_CARRY
    row["prev_row"][:] = -1
    stream.pending, stream.pending_at = row, (record.last_segment, record.last_row)


def _fill(store: PersistentReplay, slot: int, segment_id: int, verify: bool) -> None:
    path, source, overrides = segment_source(store, segment_id)
    seg = read_segment(path, verify=verify)
    columns = {**seg.columns, **overrides}
    store.cache.fill(slot, segment_id, columns, seg.rows, source, row_filter=overrides.get("_filter"))


def segment_source(store: PersistentReplay, segment_id: int) -> tuple[Path, int, dict]:
    """Where a segment's file is, its source, and column overrides (attached history)."""
    if segment_id in store.attached:
        return store.attached[segment_id]
    return store.dir / store.segments[segment_id].file, SOURCES.index("online"), {}


def attach_history(store: PersistentReplay, attachments: list[AttachConfig]) -> None:
    """Earlier buffers, read-only and filtered, join the sampling under their source."""
    next_id = -2  # attached ids are negative: older than anything this run writes
    for cfg in attachments:
        directory = Path(cfg.path)
        index = open_index_read_only(directory / "index.sqlite")
        try:
            if index.get_meta("spaces") != store.index.get_meta("spaces"):
                raise ValueError(f"buffer.attach: {directory} holds other observation/action spaces than this run")
            streams = {s.id: s for s in index.streams()}
            for record in index.segments():
                path = directory / record.file
                try:
                    seg = read_segment(path, verify=True)
                except CorruptSegment as problem:
                    store.corrupt.append(str(problem))
                    log.warning("attach: skipping %s", problem)
                    continue
                keep, task = _filter_rows(store, seg, streams, cfg)
                if not keep.any():
                    continue
                store.attached[next_id] = (path, SOURCES.index(cfg.source), {"task": task, "_filter": keep})
                store.segments[next_id] = record
                store.verified.add(next_id)
                store.transitions += int(
                    np.count_nonzero(keep & (successors(np.asarray(seg.columns["prev_row"]), seg.rows) >= 0))
                )
                next_id -= 1
        finally:
            index.close()


def open_index_read_only(path: Path) -> BufferIndex:
    """The index of an earlier buffer, read-only. A cleanly closed one (no -wal file) is read as an
    immutable file: a read-only connection to a WAL database would leave -wal/-shm files behind."""
    index = BufferIndex(path, read_only=True)  # raises FileNotFoundError naming the path
    if not path.with_name(path.name + "-wal").exists():
        index.db.close()  # nothing touched the disk yet: sqlite opens the file lazily
        index.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False)
    return index


def _filter_rows(store: PersistentReplay, seg, streams: dict[int, StreamRecord], cfg: AttachConfig):
    stream_col = np.asarray(seg.columns["stream"])
    ids = np.unique(stream_col)
    allowed = [
        i
        for i in ids.tolist()
        if i in streams
        and (cfg.robots is None or streams[i].robot in cfg.robots)
        and (cfg.tasks is None or streams[i].task in cfg.tasks)
    ]
    keep = np.isin(stream_col, allowed)
    if cfg.min_policy_version is not None:
        keep &= np.asarray(seg.columns["policy_version"]) >= cfg.min_policy_version
    task = np.zeros(seg.rows, np.int32)
    for i in allowed:
        task[stream_col == i] = store.tasks.setdefault(streams[i].task, len(store.tasks))
    return keep, task
