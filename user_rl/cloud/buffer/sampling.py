"""Sampling strategies over the buffer's catalog: which transitions go into the next batch.

The tables are kept per block: the buffer's RAM cache gives each slot a block, appends the open
segment's new transitions to its block and replaces only the block of a slot whose segment
changed (`Sampler.blocks`), so neither a draw, an append nor a segment swap re-scans the whole
catalog. A flat catalog (parallel arrays, one entry per transition) is one block that grows by
appending between `version` bumps. A draw is O(batch_size) numpy (O(batch_size log block) for
recency):

    sampler = Sampler(SamplerSettings(strategy="recency", mix={"online": 0.5, "demo": 0.5}))
    rows = sampler.draw(order, source, task, batch_size=256, rng=rng, version=catalog_version)
    plan = sampler.blocks(blocks=slots, capacity=segment_rows)   # the cache's tables
    plan.clear(slot); plan.extend(slot, rows, order, source, task); plan.draw(256, rng)

With a mix, the batch is split across sources by largest-remainder rounding of the ratios,
renormalised over the named sources that have data; rows come grouped by source, in SOURCES
order. The strategy then picks rows within each source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Literal

import numpy as np

SOURCES = ("online", "demo", "intervention")  # a source's code is its index here (uint8)
STRATEGIES = ("uniform", "recency", "task_balanced")
EMPTY = "cannot sample from an empty replay buffer"


@dataclass
class SamplerSettings:
    strategy: Literal["uniform", "recency", "task_balanced"] = "uniform"
    recency_half_life: int = 50_000  # transitions: one this much older is half as likely
    mix: dict[str, float] | None = None  # e.g. {"online": 0.5, "demo": 0.5} (RLPD); None: no split

    def validate(self) -> None:
        """Raise ValueError naming every problem at once."""
        problems = []
        if self.strategy not in STRATEGIES:
            problems.append(f"unknown strategy {self.strategy!r}; allowed: {', '.join(STRATEGIES)}")
        hl = self.recency_half_life
        if not isinstance(hl, Real) or isinstance(hl, bool) or not hl >= 1:
            problems.append(f"recency_half_life must be a number >= 1 (transitions), got {hl!r}")
        if self.mix is not None:
            unknown = [name for name in self.mix if name not in SOURCES]
            if unknown:
                problems.append(
                    f"unknown source(s) {', '.join(map(repr, unknown))} in mix; allowed: {', '.join(SOURCES)}"
                )
            bad = {
                k: v
                for k, v in self.mix.items()
                if not isinstance(v, Real) or isinstance(v, bool) or not (0 <= v < math.inf)
            }
            if bad:
                problems.append(f"mix ratios must be finite numbers >= 0, got {bad}")
            elif sum(self.mix.values()) <= 0:
                problems.append(f"mix ratios must sum to more than 0, got {dict(self.mix)}")
        if problems:
            raise ValueError("sampler settings: " + "; ".join(problems))


class Growable:
    """An array that grows by doubling, so appending n entries costs O(n) amortised."""

    def __init__(self, dtype: np.dtype | type, values: np.ndarray | None = None) -> None:
        values = np.zeros(0, dtype) if values is None else np.asarray(values, dtype)
        self.data = np.empty(max(16, len(values)), dtype)
        self.data[: len(values)] = values
        self.size = len(values)

    @classmethod
    def adopting(cls, values: np.ndarray) -> Growable:
        """One that starts as `values` itself, without a copy (the caller gives the array up)."""
        grown = cls.__new__(cls)
        grown.data, grown.size = values, len(values)
        return grown

    def append(self, values: np.ndarray) -> None:
        n = len(values)
        if self.size + n > len(self.data):
            grown = np.empty(max(2 * len(self.data), self.size + n), self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : self.size + n] = values
        self.size += n

    def view(self) -> np.ndarray:
        return self.data[: self.size]

    def __len__(self) -> int:
        return self.size


# Recency weights are exp2((order - reference) / half_life); past this exponent a block's reference
# moves up to its newest entry and its running sums are recomputed (float64 holds 2**1023).
_REBASE_EXPONENT = 600.0


class _Group:
    """One source's entries (or the whole catalog's), per block, prepared for its strategy.

    A block is one slot of the buffer's RAM cache (a flat catalog is one block). Entry i of block
    b sits at [b, i] of 2-D tables, so replacing a block costs O(its entries), appending costs
    O(new entries), and a draw picks blocks by weight and entries within them in one vectorised
    pass. Tables are np.zeros: pages no entry touched cost no RAM. A draw returns positions,
    `block * capacity + row`."""

    def __init__(self, strategy: str, half_life: float, blocks: int, capacity: int) -> None:
        self.strategy = strategy
        self.half_life = half_life
        self.capacity = capacity
        self.count = np.zeros(blocks, np.int64)
        self.total = 0  # count.sum(), kept up to date (read on every draw)
        self.rows = np.zeros((blocks, capacity), np.int32)
        if strategy == "recency":
            self.order = np.zeros((blocks, capacity), np.float64)
            self.cumulative = np.zeros((blocks, capacity), np.float64)  # running sum of weights in each block
            self.reference = np.zeros(blocks, np.float64)  # per block: the order whose weight is 1
        self.by_task: dict[int, _Group] = {}  # task_balanced: a uniform group per task

    def __len__(self) -> int:
        return self.total

    def clear(self, block: int) -> None:
        self.total -= int(self.count[block])
        self.count[block] = 0
        for group in self.by_task.values():
            group.clear(block)

    def extend(self, block: int, rows: np.ndarray, order: np.ndarray, task: np.ndarray) -> None:
        """Add entries (`rows` of the block, with their insertion order and task)."""
        n, start = len(rows), int(self.count[block])
        if not n:
            return
        if start + n > self.capacity:
            self._grow(start + n)
        if self.strategy == "task_balanced":
            for t in np.unique(task).tolist():
                group = self.by_task.get(t)
                if group is None:
                    group = self.by_task[t] = _Group("uniform", self.half_life, len(self.count), self.capacity)
                group.extend(block, rows[task == t], order, task)
        self.rows[block, start : start + n] = rows
        self.count[block] = start + n
        self.total += n
        if self.strategy == "recency":
            new_order = np.asarray(order, np.float64)
            self.order[block, start : start + n] = new_order
            top = float(new_order.max())
            if not start or (top - self.reference[block]) / self.half_life > _REBASE_EXPONENT:
                self.reference[block] = top
                weights = np.exp2((self.order[block, : start + n] - top) / self.half_life)
                self.cumulative[block, : start + n] = np.cumsum(weights)
            else:
                weights = np.exp2((new_order - self.reference[block]) / self.half_life)
                self.cumulative[block, start : start + n] = self.cumulative[block, start - 1] + np.cumsum(weights)

    def prepare(self, rows: np.ndarray, order: np.ndarray, task: np.ndarray) -> dict:
        """A whole block's tables, computed from its entries alone (a block's recency weights are
        relative to its own newest entry): the prefetcher builds them off the sampling path, and
        `put` then only copies them in."""
        prepared: dict = {"rows": rows}
        if self.strategy == "recency" and len(rows):
            order = np.asarray(order, np.float64)
            top = float(order.max())
            prepared.update(order=order, reference=top, cumulative=np.cumsum(np.exp2((order - top) / self.half_life)))
        elif self.strategy == "task_balanced":
            by_task: dict[int, dict] = {}
            if len(rows):
                sorted_by = np.argsort(task, kind="stable")
                tasks, starts = np.unique(task[sorted_by], return_index=True)
                for t, part in zip(tasks.tolist(), np.split(rows[sorted_by], starts[1:])):
                    by_task[t] = {"rows": part}
            prepared["by_task"] = by_task
        return prepared

    def put(self, block: int, prepared: dict) -> None:
        """Make a block hold exactly the prepared entries: O(its entries)."""
        self.clear(block)
        rows = prepared["rows"]
        n = len(rows)
        if n > self.capacity:
            self._grow(n)
        self.rows[block, :n] = rows
        self.count[block] = n
        self.total += n
        if self.strategy == "recency" and n:
            self.order[block, :n] = prepared["order"]
            self.cumulative[block, :n] = prepared["cumulative"]
            self.reference[block] = prepared["reference"]
        elif self.strategy == "task_balanced":
            for t, part in prepared["by_task"].items():
                group = self.by_task.get(t)
                if group is None:
                    group = self.by_task[t] = _Group("uniform", self.half_life, len(self.count), self.capacity)
                group.put(block, part)

    def _grow(self, needed: int) -> None:
        """More room per block (a flat catalog grows; a cache slot's block never outgrows its segment)."""
        capacity = max(2 * self.capacity, needed)
        for name in ("rows", "order", "cumulative"):
            old = getattr(self, name, None)
            if old is not None:
                grown = np.zeros((old.shape[0], capacity), old.dtype)
                grown[:, : self.capacity] = old
                setattr(self, name, grown)
        self.capacity = capacity
        for group in self.by_task.values():
            group._grow(capacity)

    def draw(self, k: int, rng: np.random.Generator) -> np.ndarray:
        if self.strategy == "task_balanced":
            tasks = [group for group in self.by_task.values() if len(group)]
            picked_task = rng.integers(0, len(tasks), size=k)
            out = np.empty(k, np.int64)
            for t, group in enumerate(tasks):
                chosen = picked_task == t
                count = int(np.count_nonzero(chosen))
                if count:
                    out[chosen] = group.draw(count, rng)
            return out
        if self.strategy == "recency":
            return self._draw_recency(k, rng)
        # uniform: an entry number over all blocks, then its block and the entry within it
        ends = np.cumsum(self.count)
        entry = rng.integers(0, self.total, size=k)
        if len(ends) == 1:
            return self.rows[0, entry].astype(np.int64)
        block = np.searchsorted(ends, entry, side="right")
        local = entry - (ends[block] - self.count[block])
        return block * self.capacity + self.rows[block, local]

    def _draw_recency(self, k: int, rng: np.random.Generator) -> np.ndarray:
        count = self.count
        filled = count > 0
        last = self.cumulative[np.arange(len(count)), np.maximum(count - 1, 0)]
        top = self.reference[filled].max()
        # a block's weight in the common scale (an emptied block keeps a stale reference: capped, then masked)
        weight = np.where(filled, last * np.exp2(np.minimum(self.reference - top, 0.0) / self.half_life), 0.0)
        if len(count) == 1:
            block = np.zeros(k, np.int64)
        else:
            ends = np.cumsum(weight)
            block = np.searchsorted(ends, rng.random(k) * ends[-1], side="right")
            block = np.where(
                filled[np.minimum(block, len(count) - 1)], np.minimum(block, len(count) - 1), np.flatnonzero(filled)[-1]
            )
        target = rng.random(k) * last[block]
        # the first entry whose running sum exceeds the target: a binary search in every drawn block at once
        lo, hi = np.zeros(k, np.int64), count[block] - 1
        while True:
            open_ = lo < hi
            if not open_.any():
                break
            mid = (lo + hi) // 2
            right = self.cumulative[block, mid] <= target
            lo = np.where(open_ & right, mid + 1, lo)
            hi = np.where(open_ & ~right, mid, hi)
        return block * self.capacity + self.rows[block, lo]


class _Plan:
    """The groups a draw needs (one per source of a mix, else one), over `blocks` blocks."""

    def __init__(self, version: int, settings: SamplerSettings, blocks: int = 1, capacity: int = 16) -> None:
        self.version = version
        self.size = 0  # flat catalogs: the entries added so far
        mix = settings.mix
        codes = [None] if mix is None else [c for c, name in enumerate(SOURCES) if mix.get(name, 0) > 0]
        self.members = [
            (
                code,
                _Group(settings.strategy, settings.recency_half_life, blocks, capacity),
                1.0 if code is None else float(mix[SOURCES[code]]),
            )
            for code in codes
        ]
        self.groups = tuple(group for _, group, _ in self.members)

    def __len__(self) -> int:
        """Entries a draw can pick (sources outside the mix are not among them)."""
        return sum(len(group) for group in self.groups)

    def clear(self, block: int) -> None:
        for group in self.groups:
            group.clear(block)

    def extend(self, block: int, rows: np.ndarray, order: np.ndarray, source: np.ndarray, task: np.ndarray) -> None:
        """Add a block's entries: its `rows`, with each one's insertion order, source code and task."""
        for code, group, _ in self.members:
            if code is None:
                group.extend(block, rows, order, task)
            else:
                mine = source == code
                group.extend(block, rows[mine], order[mine], task[mine])

    def prepare(self, rows: np.ndarray, order: np.ndarray, source: np.ndarray, task: np.ndarray) -> list[dict]:
        """A whole block's tables for `put`, computed from its entries alone (any thread)."""
        prepared = []
        for code, group, _ in self.members:
            mine = slice(None) if code is None else source == code
            prepared.append(group.prepare(rows[mine], order[mine], task[mine]))
        return prepared

    def put(self, block: int, prepared: list[dict]) -> None:
        """Replace a block's entries with prepared ones: copies, O(the block)."""
        for group, part in zip(self.groups, prepared):
            group.put(block, part)

    def draw(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """Positions (int64, length batch_size, with replacement): `block * capacity + row`."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        live = [(group, weight) for _, group, weight in self.members if len(group)]
        if not live:
            raise ValueError(EMPTY)
        if len(live) == 1:
            return live[0][0].draw(batch_size, rng)
        weights = np.array([w for _, w in live], np.float64)
        counts = split(weights / weights.sum(), batch_size)
        parts = [group.draw(int(k), rng) for (group, _), k in zip(live, counts) if k]
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)).astype(np.int64, copy=False)


class Sampler:
    def __init__(self, settings: SamplerSettings) -> None:
        settings.validate()
        self.settings = settings
        self.plan: _Plan | None = None

    def blocks(self, blocks: int, capacity: int) -> _Plan:
        """Tables over `blocks` blocks of up to `capacity` entries each: the RAM cache keeps one
        block per slot and replaces a slot's block alone when its segment changes."""
        return _Plan(0, self.settings, blocks, capacity)

    def draw(
        self,
        order: np.ndarray,
        source: np.ndarray,
        task: np.ndarray,
        batch_size: int,
        rng: np.random.Generator,
        version: int,
    ) -> np.ndarray:
        """Catalog indices of a flat catalog (int64, length batch_size, with replacement).

        Same `version` and a longer catalog: the new tail is added to the tables (the catalog
        only ever grows by appending between version bumps); a new version rebuilds them."""
        if not len(order) == len(source) == len(task):
            raise ValueError(
                f"catalog arrays differ in length: order {len(order)}, source {len(source)}, task {len(task)}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        size, plan = len(order), self.plan
        if plan is None or plan.version != version or size < plan.size:
            plan = self.plan = self._build(np.asarray(order), np.asarray(source), np.asarray(task), version)
        elif size > plan.size:
            self._extend(plan, order, source, task)
        return plan.draw(batch_size, rng)

    def _build(self, order: np.ndarray, source: np.ndarray, task: np.ndarray, version: int) -> _Plan:
        plan = _Plan(version, self.settings, 1, max(16, len(order)))
        self._extend(plan, order, source, task)
        return plan

    @staticmethod
    def _extend(plan: _Plan, order: np.ndarray, source: np.ndarray, task: np.ndarray) -> None:
        start, end = plan.size, len(order)
        plan.extend(
            0,
            np.arange(start, end, dtype=np.int64),
            np.asarray(order[start:end]),
            np.asarray(source[start:end]),
            np.asarray(task[start:end]),
        )
        plan.size = end


def split(weights: np.ndarray, total: int) -> np.ndarray:
    """Largest-remainder rounding of `total * weights` (weights sum to 1); ties go to the first."""
    quotas = total * np.asarray(weights, np.float64)
    counts = np.floor(quotas).astype(np.int64)
    short = total - int(counts.sum())
    if short > 0:
        counts[np.argsort(-(quotas - counts), kind="stable")[:short]] += 1
    return counts
