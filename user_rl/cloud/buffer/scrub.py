"""Background scrub: check the crc of every sealed segment that no load has checked yet.

Opening a buffer reads no segment in full, so restart time does not grow with the data kept.
Segments loaded into RAM are checked as they load; this thread checks the rest, one file at a
time, and reports progress on long scrubs. A corrupt segment is dropped from sampling, marked
corrupt in the index and listed in `stats()["corrupt_segments"]`, exactly as at a load.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from user_rl.cloud.buffer.catalog import Checked, SegmentCatalog
from user_rl.cloud.buffer.segment import verify_segment

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 5.0


class Scrubber:
    """Checks `catalog`'s unverified segments; `checked` notes each result (the store drops a
    corrupt segment), `report_error` records an unexpected error."""

    def __init__(
        self,
        catalog: SegmentCatalog,
        checked: Checked,
        report_error: Callable[[str, BaseException], None],
    ) -> None:
        self.catalog, self.checked, self.report_error = catalog, checked, report_error
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="buffer-scrub", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._scrub()
        except Exception as error:  # a dead thread must be visible, never silent
            log.exception("buffer scrub stopped")
            self.report_error("scrub", error)

    def _scrub(self) -> None:
        catalog = self.catalog
        todo = catalog.unverified()
        started = last_report = time.monotonic()
        for done, segment_id in enumerate(todo, 1):
            if self._stop.is_set():
                return
            record = catalog.sealed.get(segment_id)
            if record is None or segment_id in catalog.verified:  # evicted, or loaded (and checked) meanwhile
                continue
            self.checked(segment_id, verify_segment(catalog.directory / record.file))
            if time.monotonic() - last_report > PROGRESS_EVERY_S:
                last_report = time.monotonic()
                log.info("buffer: verified %d/%d segments", done, len(todo))
        if todo and time.monotonic() - started > PROGRESS_EVERY_S:
            log.info("buffer: verified %d/%d segments in %.0f s", len(todo), len(todo), time.monotonic() - started)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()
