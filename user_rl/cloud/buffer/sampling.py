"""Sampling strategies over the buffer's catalog: which transitions go into the next batch.

The catalog is parallel arrays, one entry per transition that can be sampled now. Between
two `version` bumps the catalog only grows by appending (new data); the sampler adds the new
entries to its per-source (and per-task / recency) tables, so neither a draw nor an append
re-scans the catalog. A version bump (a segment left RAM) rebuilds them. A draw is
O(batch_size) numpy:

    sampler = Sampler(SamplerSettings(strategy="recency", mix={"online": 0.5, "demo": 0.5}))
    rows = sampler.draw(order, source, task, batch_size=256, rng=rng, version=catalog_version)

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
                problems.append(f"unknown source(s) {', '.join(map(repr, unknown))} in mix; "
                                f"allowed: {', '.join(SOURCES)}")
            bad = {k: v for k, v in self.mix.items()
                   if not isinstance(v, Real) or isinstance(v, bool) or not (0 <= v < math.inf)}
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


# Recency weights are exp2((order - reference) / half_life); past this exponent the reference
# moves up to the newest entry and the running sums are recomputed (float64 holds 2**1023).
_REBASE_EXPONENT = 600.0


class _Group:
    """One source's entries (or the whole catalog), prepared for its strategy; grows in place.

    Without a mix the group is the whole catalog: its entries are 0..n-1 (`identity`), so no
    index array is kept and a uniform draw is one `rng.integers`."""

    def __init__(self, strategy: str, half_life: float, identity: bool) -> None:
        self.strategy = strategy
        self.half_life = half_life
        self.identity = identity and strategy != "task_balanced"
        self.count = 0
        self.index = Growable(np.int64)             # catalog indices (unless identity)
        self.cumulative = Growable(np.float64)      # recency: running sum of weights along the entries
        self.reference = 0.0                        # recency: order whose weight is 1
        self.by_task: dict[int, Growable] = {}      # task_balanced: catalog indices per task
        self.tasks: list[Growable] = []

    def __len__(self) -> int:
        return self.count

    def entries(self) -> np.ndarray:
        return np.arange(self.count, dtype=np.int64) if self.identity else self.index.view()

    def extend(self, index: np.ndarray, order: np.ndarray, task: np.ndarray) -> None:
        """Add catalog entries `index` (appended to the catalog since the last call)."""
        if not len(index):
            return
        first = not self.count
        self.count += len(index)
        if not self.identity:
            self.index.append(index)
        if self.strategy == "recency":
            new_order = order[index].astype(np.float64)
            top = float(new_order.max())
            if first or (top - self.reference) / self.half_life > _REBASE_EXPONENT:
                self.reference = top
                all_order = order[self.entries()].astype(np.float64)
                self.cumulative = Growable(np.float64, np.cumsum(np.exp2((all_order - top) / self.half_life)))
            else:
                base = self.cumulative.data[self.cumulative.size - 1]
                weights = np.exp2((new_order - self.reference) / self.half_life)
                self.cumulative.append(base + np.cumsum(weights))
        elif self.strategy == "task_balanced":
            new_task = task[index]
            for t in np.unique(new_task).tolist():
                entries = self.by_task.get(t)
                if entries is None:
                    entries = self.by_task[t] = Growable(np.int64)
                    self.tasks.append(entries)
                entries.append(index[new_task == t])

    def draw(self, k: int, rng: np.random.Generator) -> np.ndarray:
        if self.strategy == "recency":
            cumulative = self.cumulative.data[: self.count]
            pos = np.minimum(np.searchsorted(cumulative, rng.random(k) * cumulative[-1], side="right"), self.count - 1)
            return pos if self.identity else self.index.data[pos]
        if self.strategy == "task_balanced":
            picked_task = rng.integers(0, len(self.tasks), size=k)
            out = np.empty(k, np.int64)
            for t, entries in enumerate(self.tasks):
                rows = picked_task == t
                count = int(np.count_nonzero(rows))
                if count:
                    out[rows] = entries.data[rng.integers(0, entries.size, size=count)]
            return out
        pos = rng.integers(0, self.count, size=k)
        return pos if self.identity else self.index.data[pos]


class _Plan:
    """Everything a draw needs for one catalog version; entries appended to the catalog are
    added to the groups in O(new entries), so a growing catalog is never re-scanned."""

    def __init__(self, version: int, settings: SamplerSettings) -> None:
        self.version = version
        self.size = 0
        mix = settings.mix
        codes = [None] if mix is None else [c for c, name in enumerate(SOURCES) if mix.get(name, 0) > 0]
        self.members = [(code, _Group(settings.strategy, settings.recency_half_life, identity=code is None),
                         1.0 if code is None else float(mix[SOURCES[code]])) for code in codes]
        self.groups: tuple[_Group, ...] = ()
        self.weights = np.zeros(0, np.float64)  # share of each group (ratios renormalised); empty left out

    def extend(self, order: np.ndarray, source: np.ndarray, task: np.ndarray) -> None:
        start, end = self.size, len(order)
        if end <= start:
            return
        new = np.arange(start, end, dtype=np.int64)
        for code, group, _ in self.members:
            group.extend(new if code is None else new[source[start:end] == code], order, task)
        self.size = end
        live = [(g, w) for _, g, w in self.members if len(g)]
        if len(live) != len(self.groups):
            self.groups = tuple(g for g, _ in live)
            weights = np.array([w for _, w in live], np.float64)
            self.weights = weights / weights.sum() if len(weights) else weights


class Sampler:
    def __init__(self, settings: SamplerSettings) -> None:
        settings.validate()
        self.settings = settings
        self.plan: _Plan | None = None

    def draw(self, order: np.ndarray, source: np.ndarray, task: np.ndarray,
             batch_size: int, rng: np.random.Generator, version: int) -> np.ndarray:
        """Catalog indices (int64, length batch_size, with replacement).

        Same `version` and a longer catalog: the new tail is added to the tables (the catalog
        only ever grows by appending between version bumps); a new version rebuilds them."""
        if not len(order) == len(source) == len(task):
            raise ValueError(f"catalog arrays differ in length: order {len(order)}, "
                             f"source {len(source)}, task {len(task)}")
        return self.draw_first(len(order), order, source, task, batch_size, rng, version)

    def draw_first(self, size: int, order: np.ndarray, source: np.ndarray, task: np.ndarray,
                   batch_size: int, rng: np.random.Generator, version: int) -> np.ndarray:
        """`draw` over the first `size` entries of longer arrays (a growing catalog's storage)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        plan = self.plan
        if plan is None or plan.version != version or size < plan.size:
            plan = self.plan = self._build(np.asarray(order[:size]), np.asarray(source[:size]),
                                           np.asarray(task[:size]), version)
        elif size > plan.size:
            plan.extend(order[:size], source[:size], task[:size])
        groups = plan.groups
        if not groups:
            raise ValueError(EMPTY)
        if len(groups) == 1:
            return groups[0].draw(batch_size, rng)
        counts = split(plan.weights, batch_size)
        parts = [g.draw(int(k), rng) for g, k in zip(groups, counts) if k]
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)).astype(np.int64, copy=False)

    def _build(self, order: np.ndarray, source: np.ndarray, task: np.ndarray, version: int) -> _Plan:
        plan = _Plan(version, self.settings)
        plan.extend(order, source, task)
        return plan


def split(weights: np.ndarray, total: int) -> np.ndarray:
    """Largest-remainder rounding of `total * weights` (weights sum to 1); ties go to the first."""
    quotas = total * np.asarray(weights, np.float64)
    counts = np.floor(quotas).astype(np.int64)
    short = total - int(counts.sum())
    if short > 0:
        counts[np.argsort(-(quotas - counts), kind="stable")[:short]] += 1
    return counts
