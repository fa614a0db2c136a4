"""Which sealed segments the buffer may sample: its own and attached history, and their checks.

A segment is usable from its seal (or the open that found it) until it is evicted for disk
space or found corrupt. Its crc is checked once, when first loaded or by the scrub
(`verified`); a corrupt one leaves the catalog and is listed in `corrupt`. Attached segments
(earlier buffers, read-only) have negative ids and carry their source and a row filter.

Written by the ingest thread and by crc checks (under the store's lock); the prefetch and
scrub threads read copies of `sealed`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from user_rl.cloud.buffer.index import SegmentRecord
from user_rl.cloud.buffer.sampling import SOURCES
from user_rl.cloud.buffer.segment import CorruptSegment

ONLINE = SOURCES.index("online")
# Told of each crc check (segment id, the problem or None): the store's `segment_checked`, which drops a
# corrupt segment from the catalog, the cache and the counts.
Checked = Callable[[int, CorruptSegment | None], None]


class SegmentCatalog:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.sealed: dict[int, SegmentRecord] = {}  # sealed, usable (own and attached)
        self.attached: dict[int, tuple[Path, int, dict]] = {}  # id -> (file, source, column overrides)
        self.verified: set[int] = set()  # segments whose crc was checked (or that we wrote)
        self.corrupt: list[str] = []  # what was found corrupt (segments and attachments), for stats
        self._corrupt_ids: set[int] = set()

    def add(self, record: SegmentRecord, verified: bool = False) -> None:
        self.sealed[record.id] = record
        if verified:
            self.verified.add(record.id)

    def attach(self, segment_id: int, record: SegmentRecord, path: Path, source: int, overrides: dict) -> None:
        """A segment of an earlier buffer (checked as it was read), under its own negative id."""
        self.attached[segment_id] = (path, source, overrides)
        self.sealed[segment_id] = record
        self.verified.add(segment_id)

    def own(self) -> list[int]:
        """This buffer's sealed segments, oldest first."""
        return sorted(i for i in self.sealed if i not in self.attached)

    def source(self, segment_id: int) -> tuple[Path, int, dict]:
        """Where a segment's file is, its source, and column overrides (attached history)."""
        if segment_id in self.attached:
            return self.attached[segment_id]
        return self.directory / self.sealed[segment_id].file, ONLINE, {}

    def unverified(self) -> list[int]:
        """Own segments no load has checked yet, newest first (a copy: the ingest adds segments)."""
        return [i for i in sorted(self.sealed, reverse=True) if i not in self.verified and i not in self.attached]

    def checked(self, segment_id: int, problem: CorruptSegment | None) -> SegmentRecord | None:
        """Note a crc check; return the record of an own segment that it dropped (corrupt)."""
        if problem is None:
            if segment_id in self.sealed:
                self.verified.add(segment_id)
            return None
        record = self.sealed.pop(segment_id, None)
        if record is None or segment_id in self.attached:
            return None
        self.corrupt.append(str(problem))
        self._corrupt_ids.add(segment_id)
        return record

    def evict(self, segment_id: int) -> None:
        del self.sealed[segment_id]
        self.verified.discard(segment_id)

    def scrub_progress(self) -> dict[str, int]:
        """Segments checked so far (corrupt ones included) out of all there are."""
        return {
            "verified": len(self.verified) + len(self._corrupt_ids),
            "total": len(set(self.sealed) | self.verified) + len(self._corrupt_ids),
        }
