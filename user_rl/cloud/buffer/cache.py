"""The buffer's RAM cache: segments held in fixed slots of preallocated column arrays.

Every column is one array of shape (slots, segment_rows, ...), so gathering a batch from any
mix of cached segments is a single numpy fancy index, as fast as gathering from one in-RAM
array. The byte budget fixes the number of slots; one extra *spare* slot is where the
prefetcher reads a cold segment from disk, off the sampling path, before it is swapped in.
The catalog lists the transitions of the active slots for the sampler, one block of the
sampler's tables per slot (`Sampler.blocks`): a draw returns flat positions, `slot * segment_rows
+ row`. The open segment's block grows as its rows get their successors (O(new rows) per append);
a slot whose contents change (a load, a release, a prefetch swap) has its own block rebuilt, in
O(that segment), never the others. So neither the buffer's size nor rotating segments through
RAM beyond the budget makes a batch, or the ingest waiting on the lock, slower. `version` counts
whole-catalog rebuilds (only a person's discard); `slot_loads` and `loaded_rows` count the
per-slot ones.
"""

from __future__ import annotations

import ctypes
import mmap
import time
from dataclasses import dataclass

import numpy as np

from user_rl.cloud.buffer.rows import DEFAULTED_COLUMNS, successors
from user_rl.cloud.buffer.sampling import SOURCES, Growable, Sampler, SamplerSettings
from user_rl.cloud.staleness import stale_rows
from user_rl.wire.transitions import IDLE, intervened

INTERVENTION = SOURCES.index("intervention")
_MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault pages in for writing without touching their contents
_populate_supported = True  # until the kernel says otherwise (EINVAL: older than 5.14)


def populate(array: np.ndarray) -> bool:
    """Fault in the memory under a C-contiguous array now, as a write would, without reading or
    changing its contents (so other threads may write it meanwhile). A fresh slot's pages are
    otherwise faulted in one by one by the ingest's copies, on its critical path. False where the
    kernel cannot (then nothing happens)."""
    global _populate_supported
    if not _populate_supported or not array.nbytes or not array.flags.c_contiguous:
        return False
    page = mmap.PAGESIZE
    start = -(-array.ctypes.data // page) * page  # whole pages inside the array
    end = (array.ctypes.data + array.nbytes) // page * page
    if end <= start:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.madvise(start, end - start, _MADV_POPULATE_WRITE) == 0:  # ctypes lets the GIL go meanwhile
        return True
    if ctypes.get_errno() == 22:  # EINVAL: no MADV_POPULATE_WRITE here
        _populate_supported = False
    return False


@dataclass
class SlotInfo:
    segment: int | None = None  # segment id held (None: free); attached history has negative ids
    rows: int = 0
    source: int = 0  # the segment's own source (online / demo); interventions are per row
    loaded_at: float = 0.0
    pinned: bool = False  # open or recent segments never leave the cache
    row_filter: np.ndarray | None = None  # attached history: rows allowed by the filter


@dataclass
class PreparedBlock:
    """A slot's catalog block, computed before it is installed (`SlotCache.prepare`)."""

    rows: np.ndarray  # the slot's rows that are transitions the sampler may draw
    tables: list[dict]  # the sampler's tables for them
    discarded: np.ndarray  # the discarded episodes it was computed with
    looked_at: int  # rows of the slot it read


def episode_key(stream: np.ndarray, episode: np.ndarray) -> np.ndarray:
    """One uint64 per (stream id, episode number): exact below 2**32 episodes in one stream."""
    return (np.asarray(stream).astype(np.uint64) << np.uint64(32)) | np.asarray(episode).astype(np.uint64)


class SlotCache:
    def __init__(
        self,
        schema: dict[str, tuple[np.dtype, tuple]],
        segment_rows: int,
        slots: int,
        max_policy_lag: int | None = None,
        drop_stale: bool = False,
        sampler: Sampler | None = None,
        drop_idle: bool = False,
    ) -> None:
        """`max_policy_lag`: rows whose policy lagged more (`staleness.py`) are marked stale in the
        catalog, or left out of it with `drop_stale`. `drop_idle`: rows flagged idle (a person drove
        and held nothing) are left out of it. `sampler`: whose strategy the catalog's tables serve."""
        self.schema = schema
        self.max_policy_lag = max_policy_lag
        self.drop_stale = drop_stale
        self.drop_idle = drop_idle
        self.segment_rows = segment_rows
        self.slots = slots + 1  # plus the spare
        # np.zeros maps pages lazily: an unused slot costs no RAM.
        self.arrays = {n: np.zeros((self.slots, segment_rows, *s), d) for n, (d, s) in schema.items()}
        self.flat = {n: a.reshape(self.slots * segment_rows, *a.shape[2:]) for n, a in self.arrays.items()}
        self.next_row = np.full((self.slots, segment_rows), -1, np.int32)
        self.info = [SlotInfo() for _ in range(self.slots)]
        self.spare = self.slots - 1
        self.version = 0  # whole-catalog rebuilds
        self.slot_loads = 0  # slots whose catalog block was built from scratch (each O(its segment))
        self.loaded_rows = 0  # rows those builds looked at
        self.plan = (sampler or Sampler(SamplerSettings())).blocks(self.slots, segment_rows)
        self.entries = [Growable(np.int32) for _ in range(self.slots)]  # each slot's catalog rows
        self.stale = np.zeros(self.slots * segment_rows, np.bool_)  # per flat row: lagged past max_policy_lag
        self.discarded = np.zeros(0, np.uint64)  # episode_key of this buffer's discarded episodes, sorted

    # -- slots ---------------------------------------------------------------------------------
    def slot_of(self, segment: int) -> int | None:
        for i, info in enumerate(self.info):
            if info.segment is not None and info.segment == segment and i != self.spare:
                return i
        return None

    def free_slot(self) -> int | None:
        for i, info in enumerate(self.info):
            if info.segment is None and i != self.spare:
                return i
        return None

    def active(self) -> list[int]:
        return [i for i, info in enumerate(self.info) if info.segment is not None and i != self.spare]

    def fill(
        self,
        slot: int,
        segment: int,
        columns: dict[str, np.ndarray],
        rows: int,
        source: int,
        pinned: bool = False,
        row_filter: np.ndarray | None = None,
    ) -> None:
        """Copy a segment's rows into a slot (the caller makes sure nobody samples it meanwhile)."""
        for name, array in self.arrays.items():
            # a segment written before a defaulted column existed reads it as 0
            array[slot, :rows] = columns[name][:rows] if name in columns or name not in DEFAULTED_COLUMNS else 0
        self.info[slot] = SlotInfo(segment, rows, source, time.monotonic(), pinned, row_filter)
        self.refresh(slot)

    def populate(self, slot: int, start: int, end: int) -> None:
        """Fault in the memory of a slot's rows [start, end) ahead of them (`populate`): off the
        ingest thread."""
        for array in self.arrays.values():
            populate(array[slot, start:end])
        populate(self.next_row[slot, start:end])

    def open(self, slot: int, segment: int) -> None:
        """An empty slot starts holding the open segment (it adds nothing to the catalog yet)."""
        self.info[slot] = SlotInfo(segment, 0, SOURCES.index("online"), time.monotonic(), True)
        self.next_row[slot] = -1
        self._clear(slot)

    def append(self, slot: int, start: int, columns: dict[str, np.ndarray] | list[dict[str, np.ndarray]]) -> int:
        """Append rows to the open segment's slot; returns how many transitions became sampleable.
        `columns` may be a list of parts, copied one after the other (see `SegmentWriter.append`).

        Only the new rows' links are followed: a row becomes a transition when its successor
        arrives, and that never changes afterwards, so the catalog just grows."""
        n = 0
        for part in columns if isinstance(columns, list) else [columns]:
            m = len(part["kind"])
            for name, array in self.arrays.items():
                array[slot, start + n : start + n + m] = part[name]
            n += m
        self.info[slot].rows = start + n
        prev = self.arrays["prev_row"][slot, start : start + n]
        linked = np.flatnonzero(prev >= 0)
        rows = prev[linked].astype(np.int64)
        self.next_row[slot, rows] = start + linked
        rows = np.sort(rows)
        filt = self.info[slot].row_filter
        if filt is not None:
            rows = rows[filt[rows]]
        self._add(slot, rows)
        return len(rows)

    def refresh(self, slot: int) -> None:
        """The slot's rows changed as a whole (a load): recompute its links and its catalog block."""
        self._load(slot)

    def release(self, slot: int) -> None:
        self.info[slot] = SlotInfo()
        self.next_row[slot] = -1
        self._clear(slot)

    def swap_spare(self, victim: int) -> None:
        """The spare (freshly prefetched) becomes active; the victim's slot becomes the spare.
        (Its links stay: nothing follows them from a spare, and `prepare` rewrites them all.)"""
        self.info[victim] = SlotInfo()
        self.spare = victim
        self._clear(victim)

    def invalidate(self) -> None:
        """Rebuild every slot's catalog block (what may be sampled changed everywhere)."""
        self.version += 1
        for slot in self.active():
            self._load(slot)

    def discard(self, episodes: list[tuple[int, int]]) -> None:
        """Leave these (stream id, episode) out of sampling from now on (a person's re-record).
        Their rows stay on disk: export and inspection still see them."""
        if episodes:
            keys = episode_key(np.array([s for s, _ in episodes]), np.array([e for _, e in episodes]))
            self.discarded = np.union1d(self.discarded, keys)
            self.invalidate()

    # -- catalog and gathering ---------------------------------------------------------------------
    def _clear(self, slot: int) -> None:
        self.entries[slot] = Growable(np.int32)
        self.plan.clear(slot)

    def _load(self, slot: int) -> None:
        """Build one slot's catalog block from its rows: O(its segment), whatever else is cached."""
        info = self.info[slot]
        if info.segment is None:
            self._clear(slot)
            return
        self.install(slot, self.prepare(slot, info))

    def prepare(self, slot: int, info: SlotInfo) -> PreparedBlock:
        """The catalog block of a slot's rows, described by `info`: links, stale flags, sampler
        tables. O(the segment); the prefetcher runs it on the spare before the swap, off the
        sampling path (nobody reads the spare meanwhile)."""
        self.next_row[slot] = successors(self.arrays["prev_row"][slot], info.rows)
        valid = self.next_row[slot, : info.rows] >= 0
        if info.row_filter is not None:
            valid &= info.row_filter[: info.rows]
        discarded = self.discarded
        if len(discarded) and info.segment >= 0:  # attached history's stream ids are another buffer's
            keys = episode_key(self.arrays["stream"][slot, : info.rows], self.arrays["episode"][slot, : info.rows])
            valid &= ~np.isin(keys, discarded)
        rows = np.flatnonzero(valid)
        stale = stale_rows(self.arrays["policy_lag"][slot, rows], self.max_policy_lag)
        self.stale[slot * self.segment_rows + rows] = stale
        rows = self._droppable(slot, rows, stale)
        order, source, task = self._describe(slot, info, rows)
        tables = self.plan.prepare(rows, order, source, task)
        return PreparedBlock(rows.astype(np.int32), tables, discarded, info.rows)  # the catalog's dtype, here

    def install(self, slot: int, block: PreparedBlock) -> None:
        """Make a prepared block the slot's catalog (redone if a discard came in between)."""
        if block.discarded is not self.discarded:
            block = self.prepare(slot, self.info[slot])
        self.entries[slot] = Growable.adopting(block.rows)  # no copy on the sampling path
        self.plan.put(slot, block.tables)
        self.slot_loads += 1
        self.loaded_rows += block.looked_at

    def _droppable(self, slot: int, rows: np.ndarray, stale: np.ndarray) -> np.ndarray:
        """`rows` less those the settings leave out of sampling: stale ones, idle ones."""
        keep = np.ones(len(rows), bool)
        if self.drop_stale:
            keep &= ~stale
        if self.drop_idle:
            keep &= ~self.arrays[IDLE][slot, rows]
        return rows if keep.all() else rows[keep]

    def _describe(self, slot: int, info: SlotInfo, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's insertion order, source (a person's or the intervener's action makes it an
        intervention) and task: what the sampler's strategy and mix use."""
        by_someone = intervened(self.arrays["actor"][slot, rows])
        source = np.where(by_someone, INTERVENTION, info.source).astype(np.uint8)
        return info.segment * self.segment_rows + rows, source, self.arrays["task"][slot, rows]

    def _add(self, slot: int, rows: np.ndarray) -> None:
        """Rows of the open slot that became transitions join its catalog block (O(new rows))."""
        info, base = self.info[slot], slot * self.segment_rows
        stale = stale_rows(self.arrays["policy_lag"][slot, rows], self.max_policy_lag)
        self.stale[base + rows] = stale
        rows = self._droppable(slot, rows, stale)
        if not len(rows):
            return
        self.entries[slot].append(rows)
        self.plan.extend(slot, rows, *self._describe(slot, info, rows))

    def catalog_size(self) -> int:
        """Transitions in the catalog (those a sampler without a mix can draw)."""
        return sum(len(entries) for entries in self.entries)

    def catalog(self) -> dict[str, np.ndarray]:
        """Transitions of the active slots, oldest segment first: flat position, flat position of
        the next observation, insertion order, source, task, stale (parallel arrays; for
        inspection and tests: built in O(catalog))."""
        slots = sorted(self.active(), key=lambda i: self.info[i].segment)
        rows = [self.entries[i].view().astype(np.int64) for i in slots]
        position = np.concatenate([np.zeros(0, np.int64), *[i * self.segment_rows + r for i, r in zip(slots, rows)]])
        order = np.concatenate(
            [np.zeros(0, np.int64), *[self.info[i].segment * self.segment_rows + r for i, r in zip(slots, rows)]]
        )
        source = np.concatenate(
            [
                np.zeros(0, np.uint8),
                *[
                    np.where(intervened(self.arrays["actor"][i, r]), INTERVENTION, self.info[i].source).astype(np.uint8)
                    for i, r in zip(slots, rows)
                ],
            ]
        )
        return {
            "position": position,
            "next": self.successor(position),
            "order": order,
            "source": source,
            "task": self.flat["task"][position],
            "stale": self.stale[position],
        }

    def successor(self, position: np.ndarray) -> np.ndarray:
        """Flat position of each transition's next-observation row (same slot)."""
        slot = position // self.segment_rows
        return slot * self.segment_rows + self.next_row.reshape(-1)[position]

    def walk(self, start: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows of up to `n` consecutive steps from each start row, (B, n), and how many of them
        are real, (B,). A walk stops at the end of its episode and where the next row's successor
        has not arrived yet (the end of a segment); the rest of its row repeats the last real row."""
        terminated, truncated = self.flat["terminated"], self.flat["truncated"]
        flat_next = self.next_row.reshape(-1)
        rows = np.empty((len(start), n), np.int64)
        rows[:, 0] = cur = start
        steps = np.ones(len(start), np.int64)
        for k in range(1, n):
            nxt = self.successor(cur)
            go = ~(terminated[cur] | truncated[cur]) & (flat_next[nxt] >= 0) & (steps == k)
            cur = np.where(go, nxt, cur)
            rows[:, k] = cur
            steps += go
        return rows, steps

    def n_step(self, rows: np.ndarray, steps: np.ndarray, gamma: float) -> tuple[np.ndarray, ...]:
        """Discounted n-step reward, discount for bootstrapping, last terminated flag, next-obs row,
        along a `walk` of n steps (within the episode and the segment)."""
        n = rows.shape[1]
        real = np.arange(n) < steps[:, None]
        powers = gamma ** np.arange(n, dtype=np.float32)
        total = (self.flat["reward"][rows] * powers * real).sum(1, dtype=np.float32)
        last = rows[np.arange(len(rows)), steps - 1]
        return total, (gamma**steps).astype(np.float32), self.flat["terminated"][last], self.successor(last)
