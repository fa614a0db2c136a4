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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from user_rl.cloud.buffer.catalog import Checked, SegmentCatalog
from user_rl.cloud.buffer.commitlog import CommitLog
from user_rl.cloud.buffer.index import BufferIndex, SegmentRecord, StreamRecord
from user_rl.cloud.buffer.rows import (
    DEFAULTED_COLUMNS,
    KIND_CARRY,
    KIND_RECORD,
    StreamState,
    account,
    row_bytes,
    successors,
)
from user_rl.cloud.buffer.sampling import SOURCES
from user_rl.cloud.buffer.segment import CorruptSegment, read_segment, seal_open_file
from user_rl.cloud.buffer.streams import StreamRegistry
from user_rl.wire.spaces import same_spaces, space_differences, spaces_from_text, spaces_to_text
from user_rl.wire.transitions import DISCARD, intervened

if TYPE_CHECKING:
    from user_rl.cloud.buffer.cache import SlotCache
    from user_rl.config import AttachConfig

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 5.0  # long opens and scrubs log how far they are


@dataclass
class Opened:
    """The counts an open found on disk; the store starts its counters from them."""

    transitions: int = 0  # sampleable transitions in the usable segments
    records: int = 0  # step records ever produced (evicted segments included)
    lost_batches: int = 0
    discarded_rows: int = 0  # transitions of discarded episodes
    discarded: list[tuple[int, int]] = field(default_factory=list)  # (stream, episode) never sampled


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
        layout, bounds = space_differences(spaces_from_text({"hello_hex": stored}), (obs_space, action_space))
        raise ValueError(
            f"the buffer at {index.path.parent} (there) holds other spaces than this fleet's (here): "
            f"{'; '.join(layout + bounds)}: use a new run directory"
        )
    return int(index.get_meta("segment_rows"))


def load_existing(directory: Path, index: BufferIndex, streams: StreamRegistry, catalog: SegmentCatalog) -> Opened:
    """Streams into `streams`, sealed segments into `catalog`, leftovers of a crash sealed; the counts.

    Pending records are restored afterwards (`restore_pending`), once the store counts."""
    opened = Opened()
    open_episodes: dict[int, dict] = {}
    for ep in index.episodes():
        if ep.status == "open":
            open_episodes.setdefault(ep.stream, {})[ep.episode] = ep
        elif ep.end_reason == DISCARD:
            opened.discarded.append((ep.stream, ep.episode))
            opened.discarded_rows += max(ep.length - 1, 0)
    records = index.stream_records()
    for record in index.streams():
        state = streams.adopt(record)
        state.episodes = open_episodes.get(record.id, {})
        state.records = records.get(record.id, 0)
    streams.note_id(index.max_stream_id())
    for record in index.segments():
        catalog.add(record)
        opened.transitions += record.transitions
    opened.records = sum(r.records for r in index.segments(status=None))  # evicted ones were produced too
    opened.lost_batches = index.lost_count()
    _delete_evicted_files(directory, index)
    for open_path in sorted(directory.glob("open-*.seg")) + sorted(directory.glob("open-*.log")):
        if open_path.exists():
            _recover_open(directory, index, streams, catalog, int(open_path.stem.split("-")[1]), opened)
    if catalog.sealed:
        log.info("buffer %s: %d segments, %d transitions", directory, len(catalog.sealed), opened.transitions)
    return opened


def _delete_evicted_files(directory: Path, index: BufferIndex) -> None:
    """Eviction marks the index first, then deletes: a crash in between leaves the file behind."""
    for record in index.segments(status="evicted"):
        path = directory / record.file
        if path.exists():
            path.unlink()
            log.info("deleted %s, evicted before the last shutdown", record.file)


def fill_cache(cache: SlotCache, catalog: SegmentCatalog, checked: Checked) -> None:
    """Newest own segments into RAM first, then attached history; the rest waits for the prefetcher.

    Each own segment's crc is checked as it is loaded (it is read in full anyway)."""
    wanted = catalog.own()[::-1] + sorted(catalog.attached, reverse=True)
    last_report = time.monotonic()
    for done, segment_id in enumerate(wanted):
        slot = cache.free_slot()
        if slot is None or len(cache.active()) >= cache.slots - 2:  # keep one for the open segment
            break
        try:
            _fill(cache, catalog, slot, segment_id, verify=segment_id not in catalog.verified)
        except CorruptSegment as problem:
            checked(segment_id, problem)
            continue
        checked(segment_id, None)
        if time.monotonic() - last_report > PROGRESS_EVERY_S:
            last_report = time.monotonic()
            log.info("buffer: loaded %d/%d segments into RAM (crc checked)", done + 1, len(wanted))


def _recover_open(
    directory: Path,
    index: BufferIndex,
    streams: StreamRegistry,
    catalog: SegmentCatalog,
    segment_id: int,
    opened: Opened,
) -> None:
    """Seal the committed rows of a segment a crash left open, and register them."""
    open_path = directory / f"open-{segment_id:08d}.seg"
    log_path = directory / f"open-{segment_id:08d}.log"
    final = directory / f"seg-{segment_id:08d}.seg"
    records = [json.loads(p) for p in CommitLog.read(log_path)[0]]
    if segment_id in catalog.sealed or not records:
        open_path.unlink(missing_ok=True)
        log_path.unlink(missing_ok=True)
        return
    try:
        if open_path.exists():
            seal_open_file(open_path, max(r["end"] for r in records), final)
        segment = read_segment(final)
    except CorruptSegment as problem:
        catalog.corrupt.append(str(problem))
        log.warning("could not recover %s", problem)
        return
    columns, rows = segment.columns, segment.rows
    batches, lost = [], []
    for r in records:
        stream = streams.get(r["r"], r["e"]) or streams.adopt(StreamRecord(r["s"], r["r"], r["e"], r["t"]))
        stream.record.last_seq = stream.durable_seq = max(stream.record.last_seq, r["q"])
        if r.get("lost"):
            lost.append((stream.record.id, r["q"], segment_id))
            opened.lost_batches += 1
        else:
            batches.append((stream.record.id, r["q"], r["n"]))
            stream.records += r["n"]
    touched = {b[0] for b in batches + lost}
    written = [s for s in streams.in_ram.values() if s.record.id in touched]
    for stream in written:
        mine = (columns["stream"][:rows] == stream.record.id) & (columns["kind"][:rows] == KIND_RECORD)
        # An episode the index already has as ended (an edge restart cut it, then this crash) keeps
        # its record: accounting its rows again would reopen it.
        ended = [ep.episode for ep in index.episodes(stream.record.id) if ep.status != "open"]
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
    episodes = [ep for s in written for ep in s.episodes.values() if ep.last_segment == segment_id]
    index.register_segment(record, batches, [s.record for s in written], episodes, lost)
    catalog.add(record, verified=True)
    opened.transitions += transitions
    opened.records += record.records
    log_path.unlink(missing_ok=True)
    log.warning(
        "recovered %d committed batches (%d rows) of segment %d left open by a crash", len(batches), rows, segment_id
    )


def restore_pending(stream: StreamState, catalog: SegmentCatalog, checked: Checked) -> None:
    """The stream's last record, if its episode goes on, so the next batch continues it."""
    record = stream.record
    if record.last_segment not in catalog.sealed or record.last_row is None:
        return
    try:
        seg = read_segment(catalog.directory / catalog.sealed[record.last_segment].file, verify=False)
    except CorruptSegment as problem:  # its episode cannot be continued: the next batch starts unpaired
        checked(record.last_segment, problem)
        return
    row = {k: np.array(v[record.last_row : record.last_row + 1]) for k, v in seg.columns.items()}
    for name, dtype in DEFAULTED_COLUMNS.items():  # a segment written before the column existed
        row.setdefault(name, np.zeros(1, dtype))
    episode = stream.episodes.get(int(row["episode"][0]))  # only open episodes are loaded
    if row["terminated"][0] or row["truncated"][0] or episode is None or episode.status != "open":
        return  # ended, or cut short by an edge restart: nothing may follow it
    row["kind"][:] = KIND_CARRY
    row["prev_row"][:] = -1
    stream.pending, stream.pending_at = row, (record.last_segment, record.last_row)


def _fill(cache: SlotCache, catalog: SegmentCatalog, slot: int, segment_id: int, verify: bool) -> None:
    path, source, overrides = catalog.source(segment_id)
    seg = read_segment(path, verify=verify)
    columns = {**seg.columns, **overrides}
    cache.fill(slot, segment_id, columns, seg.rows, source, row_filter=overrides.get("_filter"))


def _check_attachable(directory: Path, theirs: str, ours: str | None) -> None:
    """An attached buffer's rows must have this run's layout (keys, shapes, dtypes); bounds may differ
    (a dataset imported from LeRobot has its stats' range): this run's govern, and the log says so."""
    layout, bounds = space_differences(spaces_from_text({"hello_hex": theirs}), spaces_from_text({"hello_hex": ours}))
    if layout:
        raise ValueError(
            f"buffer.attach: {directory} (there) holds other observations or actions than this run (here): "
            + "; ".join(layout)
        )
    log.warning("buffer.attach: %s has other bounds than this run, whose apply: %s", directory, "; ".join(bounds))


def attach_history(
    attachments: list[AttachConfig], spaces: str | None, catalog: SegmentCatalog, task_code: Callable[[str], int]
) -> int:
    """Earlier buffers, read-only and filtered, join the sampling under their source (`spaces`: this
    buffer's, as its index stores them); the transitions they add."""
    transitions = 0
    next_id = -2  # attached ids are negative: older than anything this run writes
    for cfg in attachments:
        directory = Path(cfg.path)
        index = open_index_read_only(directory / "index.sqlite")
        try:
            their_spaces = index.get_meta("spaces")
            if their_spaces != spaces:
                _check_attachable(directory, their_spaces, spaces)
            streams = {s.id: s for s in index.streams()}
            for record in index.segments():
                path = directory / record.file
                try:
                    seg = read_segment(path, verify=True)
                except CorruptSegment as problem:
                    catalog.corrupt.append(str(problem))
                    log.warning("attach: skipping %s", problem)
                    continue
                keep, task = _filter_rows(task_code, seg, streams, cfg)
                if not keep.any():
                    continue
                catalog.attach(next_id, record, path, SOURCES.index(cfg.source), {"task": task, "_filter": keep})
                transitions += int(
                    np.count_nonzero(keep & (successors(np.asarray(seg.columns["prev_row"]), seg.rows) >= 0))
                )
                next_id -= 1
        finally:
            index.close()
    return transitions


def open_index_read_only(path: Path) -> BufferIndex:
    """The index of an earlier buffer, read-only. A cleanly closed one (no -wal file) is read as an
    immutable file: a read-only connection to a WAL database would leave -wal/-shm files behind."""
    index = BufferIndex(path, read_only=True)  # raises FileNotFoundError naming the path
    if not path.with_name(path.name + "-wal").exists():
        index.db.close()  # nothing touched the disk yet: sqlite opens the file lazily
        index.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False)
    return index


def _filter_rows(task_code: Callable[[str], int], seg, streams: dict[int, StreamRecord], cfg: AttachConfig):
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
        task[stream_col == i] = task_code(streams[i].task)
    return keep, task
