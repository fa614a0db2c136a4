"""Rotates cold segments through the RAM cache so sampling never waits on disk.

When the buffer holds more than its RAM budget, a background thread reads a cold segment
(chosen at random, in proportion to its transitions) into the cache's spare slot. The
sampling thread swaps it in between two batches, evicting the unpinned segment that has been
in RAM longest. Over time every transition spends a share of time in RAM proportional to the
budget, so sampling stays uniform in expectation while each batch comes from RAM.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from user_rl.cloud.buffer.cache import SlotInfo
from user_rl.cloud.buffer.segment import CorruptSegment, read_segment

if TYPE_CHECKING:
    from user_rl.cloud.buffer.store import PersistentReplay

log = logging.getLogger(__name__)


class Prefetcher:
    def __init__(self, store: PersistentReplay, samples_per_swap: int = 4, seed: int = 0) -> None:
        self.store = store
        self.samples_per_swap = samples_per_swap
        self.rng = np.random.default_rng(seed)
        self._want = threading.Event()
        self._ready: tuple[int, int] | None = None   # (segment id, rows) sitting in the spare slot
        self._lock = threading.Lock()
        self._closed = False
        self._samples = 0
        self.swaps = 0
        self._thread: threading.Thread | None = None

    def cold(self) -> list[int]:
        cached = {self.store.cache.info[s].segment for s in self.store.cache.active()}
        return [i for i in self.store.segments if i not in cached]

    def sampled(self) -> None:
        """Called after each batch: every few batches, ask for one more cold segment."""
        self._samples += 1
        if self._samples % self.samples_per_swap == 0 and self._ready is None and self.cold():
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="buffer-prefetch", daemon=True)
                self._thread.start()
            self._want.set()

    def install_ready(self) -> None:
        """Swap a prefetched segment in (sampling thread only, between batches)."""
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is None:
            return
        segment, rows = ready
        store, cache = self.store, self.store.cache
        unpinned = [i for i in cache.active() if not cache.info[i].pinned]
        if segment not in store.segments or not unpinned:
            return
        victim = min(unpinned, key=lambda i: cache.info[i].loaded_at)
        cache.info[cache.spare] = self._loaded_info
        cache.refresh(cache.spare)
        cache.swap_spare(victim)
        self.swaps += 1

    def _run(self) -> None:
        from user_rl.cloud.buffer.recovery import segment_source  # recovery imports the store's parts

        while True:
            self._want.wait()
            self._want.clear()
            if self._closed:
                return
            cold = self.cold()
            if not cold or self._ready is not None:
                continue
            weights = np.array([max(1, self.store.segments[i].transitions) for i in cold], float)
            segment = cold[int(self.rng.choice(len(cold), p=weights / weights.sum()))]
            try:
                path, source, overrides = segment_source(self.store, segment)
                self._load_into_spare(segment, path, source, overrides)
            except (CorruptSegment, OSError, KeyError) as problem:  # evicted meanwhile, or damaged since
                log.warning("prefetch of segment %s failed: %s", segment, problem)

    def _load_into_spare(self, segment: int, path, source: int, overrides: dict) -> None:
        cache = self.store.cache
        seg = read_segment(path, verify=False)
        spare = cache.spare
        for name, array in cache.arrays.items():
            array[spare, : seg.rows] = overrides.get(name, seg.columns[name])[: seg.rows]
        self._loaded_info = SlotInfo(segment, seg.rows, source, time.monotonic(), False, overrides.get("_filter"))
        with self._lock:
            self._ready = (segment, seg.rows)

    def close(self) -> None:
        self._closed = True
        self._want.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
