"""Rotates cold segments through the RAM cache so sampling never waits on disk.

When the buffer holds more than its RAM budget, a background thread reads a cold segment
(chosen at random, in proportion to its transitions) into the cache's spare slot. The
sampling thread swaps it in between two batches, evicting the unpinned segment that has been
in RAM longest. Over time every transition spends a share of time in RAM proportional to the
budget, so sampling stays uniform in expectation while each batch comes from RAM.

A segment's first load checks its crc (a corrupt one is dropped, as the scrub would). Any
unexpected error is logged with its traceback and recorded in the store's `thread_errors()`;
the thread keeps serving later requests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from user_rl.cloud.buffer.cache import PreparedBlock, SlotCache, SlotInfo
from user_rl.cloud.buffer.catalog import Checked, SegmentCatalog
from user_rl.cloud.buffer.rows import DEFAULTED_COLUMNS
from user_rl.cloud.buffer.segment import CorruptSegment, read_segment_into

log = logging.getLogger(__name__)


class Prefetcher:
    """Fills `cache`'s spare slot with cold segments of `catalog`; `checked` notes a crc check
    (the store drops a corrupt segment), `report_error` records an unexpected error."""

    def __init__(
        self,
        cache: SlotCache,
        catalog: SegmentCatalog,
        checked: Checked,
        report_error: Callable[[str, BaseException], None],
        samples_per_swap: int,  # buffer.batches_per_swap
        seed: int = 0,
    ) -> None:
        self.cache, self.catalog = cache, catalog
        self.checked, self.report_error = checked, report_error
        self.samples_per_swap = samples_per_swap
        self.rng = np.random.default_rng(seed)
        self._want = threading.Event()
        self._ready: tuple[SlotInfo, PreparedBlock] | None = None  # the segment in the spare slot, ready to swap in
        self._lock = threading.Lock()
        self._closed = False
        self._samples = 0
        self.swaps = 0
        self._thread: threading.Thread | None = None

    def cold(self) -> list[int]:
        cached = {self.cache.info[s].segment for s in self.cache.active()}
        return [i for i in list(self.catalog.sealed) if i not in cached]  # a copy: the writer adds segments

    def sampled(self) -> None:
        """Called after each batch: every few batches, ask for one more cold segment."""
        self._samples += 1
        if self._samples % self.samples_per_swap == 0 and self._ready is None and self.cold():
            self._start()
            self._want.set()

    def wanted(self) -> None:
        """Ask for a cold segment now (nothing in RAM can be drawn: waiting for batches would wait forever)."""
        if self._ready is None and self.cold():
            self._start()
            self._want.set()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="buffer-prefetch", daemon=True)
            self._thread.start()

    def install_ready(self) -> None:
        """Swap a prefetched segment in (sampling thread only, between batches, under the store's lock).

        Under the prefetcher's lock too, so the loader never starts filling the spare while it
        changes hands. A free slot is taken before any cached segment is evicted.
        """
        if self._ready is None:  # the common case, without taking the lock
            return
        with self._lock:
            ready, self._ready = self._ready, None
            if ready is None:
                return
            cache = self.cache
            cached = {cache.info[i].segment for i in cache.active()}
            if ready[0].segment not in self.catalog.sealed or ready[0].segment in cached:
                return
            free = cache.free_slot()
            unpinned = [i for i in cache.active() if not cache.info[i].pinned]
            if free is None and not unpinned:
                return
            spare = cache.spare
            info, block = ready
            cache.info[spare] = info
            cache.install(spare, block)  # prepared off the sampling path: O(copies of one segment's entries)
            if free is not None:
                cache.spare = free  # the free slot becomes the next spare; nothing leaves RAM
            else:
                cache.swap_spare(min(unpinned, key=lambda i: cache.info[i].loaded_at))
            self.swaps += 1

    def _run(self) -> None:
        while True:
            self._want.wait()
            self._want.clear()
            if self._closed:
                return
            try:
                self._prefetch_one()
            except Exception as error:  # unexpected: record it (status shows it) and keep serving
                log.exception("buffer prefetch failed")
                self.report_error("prefetch", error)

    def _prefetch_one(self) -> None:
        cold = self.cold()
        if not cold or self._ready is not None:
            return
        records = [self.catalog.sealed.get(i) for i in cold]  # one may be evicted meanwhile
        weights = np.array([max(1, r.transitions) if r else 0 for r in records], float)
        if not weights.sum():
            return
        segment = cold[int(self.rng.choice(len(cold), p=weights / weights.sum()))]
        try:
            path, source, overrides = self.catalog.source(segment)
            self._load_into_spare(segment, path, source, overrides)
        except CorruptSegment as problem:  # first load of a segment the scrub has not reached
            self.checked(segment, problem)
        except (OSError, KeyError) as problem:  # evicted meanwhile
            log.warning("prefetch of segment %s failed: %s", segment, problem)

    def _load_into_spare(self, segment: int, path, source: int, overrides: dict) -> None:
        cache = self.cache
        verify = segment not in self.catalog.verified
        with self._lock:  # the spare only changes hands in install_ready, which needs _ready set
            spare = cache.spare
        targets = {name: array[spare] for name, array in cache.arrays.items() if name not in overrides}
        rows, present = read_segment_into(path, targets, verify=verify)  # GIL-free reads: sampling goes on
        if verify:
            self.checked(segment, None)
        for name in targets.keys() - present:
            if name not in DEFAULTED_COLUMNS:
                raise KeyError(f"segment {segment} ({path}) has no column {name!r}")
            targets[name][:rows] = 0  # a segment written before a defaulted column existed reads it as 0
        for name, values in overrides.items():
            if name in cache.arrays:
                cache.arrays[name][spare, :rows] = values[:rows]
        info = SlotInfo(segment, rows, source, time.monotonic(), False, overrides.get("_filter"))
        block = cache.prepare(spare, info)  # links, stale flags and sampler tables, before the swap
        with self._lock:
            self._ready = (info, block)

    def close(self) -> None:
        self._closed = True
        self._want.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
