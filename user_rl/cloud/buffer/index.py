"""The buffer's index in SQLite: segments, streams, batches and episodes.

The index is what survives a crash besides the segment files themselves: which sealed
segments exist, which (robot, epoch, seq) batches they hold (so a re-sent batch is never
stored twice), where each stream's last record lives (so an episode continues across a
restart), the batches an edge lost before sending them (so a re-sent lost seq is known) and a
per-episode summary for filtering and `user-rl buffer inspect`, and the names of the people the
rows' person columns refer to (`people.py`). One transaction per sealed
segment keeps it consistent with the files. A lock makes the connection safe to share between
the buffer's ingest thread and its scrubber.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CONTROL_HZ = "control_hz/"  # meta key prefix: a robot's control rate, for the fps of an export
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS segments (
    id INTEGER PRIMARY KEY, file TEXT NOT NULL, rows INTEGER NOT NULL, records INTEGER NOT NULL,
    transitions INTEGER NOT NULL, bytes INTEGER NOT NULL, created REAL NOT NULL,
    min_version INTEGER NOT NULL, max_version INTEGER NOT NULL,
    intervention_rows INTEGER NOT NULL, source TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'ok');
CREATE TABLE IF NOT EXISTS streams (
    id INTEGER PRIMARY KEY, robot TEXT NOT NULL, epoch INTEGER NOT NULL, task TEXT NOT NULL,
    last_seq INTEGER NOT NULL DEFAULT 0, last_segment INTEGER, last_row INTEGER,
    UNIQUE (robot, epoch));
CREATE TABLE IF NOT EXISTS batches (
    stream INTEGER NOT NULL, seq INTEGER NOT NULL, segment INTEGER NOT NULL, records INTEGER NOT NULL,
    PRIMARY KEY (stream, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS episodes (
    stream INTEGER NOT NULL, episode INTEGER NOT NULL, robot TEXT NOT NULL, task TEXT NOT NULL,
    length INTEGER NOT NULL, return REAL NOT NULL, success INTEGER, interventions INTEGER NOT NULL,
    min_version INTEGER NOT NULL, max_version INTEGER NOT NULL, status TEXT NOT NULL,
    first_segment INTEGER NOT NULL, last_segment INTEGER NOT NULL, end_reason TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (stream, episode)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS open_episodes ON episodes (stream) WHERE status = 'open';
CREATE TABLE IF NOT EXISTS lost (
    stream INTEGER NOT NULL, seq INTEGER NOT NULL, segment INTEGER NOT NULL,
    PRIMARY KEY (stream, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS people (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
"""


@dataclass
class SegmentRecord:
    id: int
    file: str
    rows: int
    records: int
    transitions: int
    bytes: int
    created: float
    min_version: int
    max_version: int
    intervention_rows: int
    source: str
    status: str = "ok"


@dataclass
class StreamRecord:
    id: int
    robot: str
    epoch: int
    task: str
    last_seq: int = 0
    last_segment: int | None = None
    last_row: int | None = None


@dataclass
class EpisodeRecord:
    stream: int
    episode: int
    robot: str
    task: str
    length: int = 0
    ret: float = 0.0
    success: int | None = None
    interventions: int = 0
    min_version: int = 2**62
    max_version: int = -(2**62)
    status: str = "open"  # open / terminated / truncated
    first_segment: int = -1
    last_segment: int = -1
    end_reason: str = ""  # why a truncated episode ended early: "edge_restart" (else the env's time limit)


def _locked(method):
    """Run a method under the index's lock (one SQLite connection, two threads)."""

    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    run.__name__, run.__doc__ = method.__name__, method.__doc__
    return run


class BufferIndex:
    """SQLite index of one buffer directory (read-only for attached history)."""

    def __init__(self, path: Path, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.RLock()
        if read_only:
            if not self.path.is_file():
                raise FileNotFoundError(f"no buffer index at {self.path}")
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        else:
            self.db = sqlite3.connect(self.path, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(SCHEMA)
            self.db.commit()

    # -- meta --------------------------------------------------------------------------------
    @_locked
    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    @_locked
    def control_rates(self) -> dict[str, float]:
        """Each robot's control rate (Hz), as the buffer recorded it when the robot's streams opened."""
        rows = self.db.execute("SELECT key, value FROM meta WHERE key LIKE ?", (CONTROL_HZ + "%",))
        return {key.removeprefix(CONTROL_HZ): float(value) for key, value in rows}

    @_locked
    def set_meta(self, values: dict[str, str]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())

    # -- reading -----------------------------------------------------------------------------
    @_locked
    def segments(self, status: str | None = "ok") -> list[SegmentRecord]:
        sql = "SELECT * FROM segments" + (" WHERE status = ?" if status else "") + " ORDER BY id"
        return [SegmentRecord(*row) for row in self.db.execute(sql, (status,) if status else ())]

    @_locked
    def streams(self) -> list[StreamRecord]:
        return [StreamRecord(*row) for row in self.db.execute("SELECT * FROM streams ORDER BY id")]

    @_locked
    def stream(self, robot: str, epoch: int) -> StreamRecord | None:
        row = self.db.execute("SELECT * FROM streams WHERE robot = ? AND epoch = ?", (robot, epoch)).fetchone()
        return StreamRecord(*row) if row else None

    @_locked
    def last_seqs(self, robot: str, epochs: list[int]) -> dict[int, int]:
        """The last seq of each of the robot's `epochs` that has a stream (one query)."""
        sql = f"SELECT epoch, last_seq FROM streams WHERE robot = ? AND epoch IN ({','.join('?' * len(epochs))})"
        return {int(e): int(q) for e, q in self.db.execute(sql, (robot, *epochs))} if epochs else {}

    @_locked
    def max_stream_id(self) -> int:
        return int(self.db.execute("SELECT COALESCE(MAX(id), 0) FROM streams").fetchone()[0])

    @_locked
    def streams_with_open_episodes(self, robot: str, below_epoch: int) -> list[StreamRecord]:
        """The robot's older streams whose episode the index still has open (an edge restart ends it)."""
        # From the open episodes (a partial index: few), not the robot's streams (thousands, after a flood).
        sql = (
            "SELECT DISTINCT s.* FROM episodes e CROSS JOIN streams s ON s.id = e.stream "
            "WHERE e.status = 'open' AND s.robot = ? AND s.epoch < ? ORDER BY s.id"
        )
        return [StreamRecord(*row) for row in self.db.execute(sql, (robot, below_epoch))]

    @_locked
    def episodes(self, stream: int | None = None) -> list[EpisodeRecord]:
        if stream is None:
            return [EpisodeRecord(*row) for row in self.db.execute("SELECT * FROM episodes ORDER BY stream, episode")]
        sql = "SELECT * FROM episodes WHERE stream = ? ORDER BY episode"
        return [EpisodeRecord(*row) for row in self.db.execute(sql, (stream,))]

    @_locked
    def stream_records(self, stream: int | None = None) -> dict[int, int]:
        """Step records stored per stream (from the batches table)."""
        sql = "SELECT stream, SUM(records) FROM batches" + (" WHERE stream = ?" if stream is not None else "")
        rows = self.db.execute(sql + " GROUP BY stream", (stream,) if stream is not None else ())
        return {int(s): int(n) for s, n in rows}

    @_locked
    def batch_keys(self) -> list[tuple[str, int, int]]:
        sql = "SELECT s.robot, s.epoch, b.seq FROM batches b JOIN streams s ON s.id = b.stream"
        return [(r, int(e), int(q)) for r, e, q in self.db.execute(sql)]

    @_locked
    def lost_keys(self) -> list[tuple[str, int, int]]:
        sql = "SELECT s.robot, s.epoch, l.seq FROM lost l JOIN streams s ON s.id = l.stream"
        return [(r, int(e), int(q)) for r, e, q in self.db.execute(sql)]

    @_locked
    def people(self) -> dict[int, str]:
        """The run's people by id (`people.py`); none in a buffer from before the table."""
        try:
            return {int(i): str(name) for i, name in self.db.execute("SELECT id, name FROM people")}
        except sqlite3.OperationalError:  # no such table: an old buffer, opened read-only
            return {}

    @_locked
    def add_people(self, people: dict[int, str]) -> None:
        """Record new people's ids, durably (one transaction) before any row uses them."""
        with self.db:
            self.db.executemany("INSERT INTO people VALUES (?, ?)", people.items())

    @_locked
    def batch_count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM batches").fetchone()[0])

    @_locked
    def lost_count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM lost").fetchone()[0])

    # -- writing (one transaction per sealed segment) -----------------------------------------
    @_locked
    def register_segment(
        self,
        segment: SegmentRecord | None,
        batches: Iterable[tuple[int, int, int]],
        streams: Iterable[StreamRecord],
        episodes: Iterable[EpisodeRecord],
        lost: Iterable[tuple[int, int, int]] = (),
    ) -> None:
        """Make a sealed segment and everything it holds visible, atomically. Without a segment:
        only row-less batches (lost ones, episode-end markers), under segment 0."""
        with self.db:
            if segment is not None:
                self.db.execute(
                    "INSERT OR REPLACE INTO segments VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", tuple(segment.__dict__.values())
                )
            self.db.executemany(
                "INSERT OR IGNORE INTO batches VALUES (?,?,?,?)",
                [(stream, seq, segment.id if segment else 0, n) for stream, seq, n in batches],
            )
            self.db.executemany("INSERT OR IGNORE INTO lost VALUES (?,?,?)", list(lost))
            self._upsert_streams(streams)
            self._upsert_episodes(episodes)

    @_locked
    def update_episodes(self, episodes: Iterable[EpisodeRecord], streams: Iterable[StreamRecord] = ()) -> None:
        with self.db:
            self._upsert_streams(streams)
            self._upsert_episodes(episodes)

    @_locked
    def set_segment_status(self, segment_ids: Iterable[int], status: str) -> None:
        with self.db:
            self.db.executemany("UPDATE segments SET status = ? WHERE id = ?", [(status, i) for i in segment_ids])

    def _upsert_streams(self, streams: Iterable[StreamRecord]) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO streams VALUES (?,?,?,?,?,?,?)", [tuple(s.__dict__.values()) for s in streams]
        )

    def _upsert_episodes(self, episodes: Iterable[EpisodeRecord]) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO episodes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [tuple(e.__dict__.values()) for e in episodes],
        )

    @_locked
    def close(self) -> None:
        self.db.close()
