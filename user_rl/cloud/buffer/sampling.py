"""Sampling strategies over the buffer's catalog: which transitions go into the next batch.

The catalog is parallel arrays, one entry per transition that can be sampled now, in
insertion order. The caller bumps `version` whenever it changes; the sampler rebuilds its
per-source (and per-task / recency) tables only then, so a draw is O(batch_size) numpy:

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


@dataclass(frozen=True)
class _Group:
    """One source's entries (or the whole catalog), prepared for its strategy."""

    index: np.ndarray  # catalog indices; for task_balanced, sorted by task
    cumulative: np.ndarray | None = None  # recency: running sum of weights along `index`
    task_starts: np.ndarray | None = None  # task_balanced: where each task's run starts in `index`
    task_sizes: np.ndarray | None = None

    def draw(self, k: int, rng: np.random.Generator) -> np.ndarray:
        if self.cumulative is not None:
            u = rng.random(k) * self.cumulative[-1]
            pos = np.searchsorted(self.cumulative, u, side="right")
            return self.index[np.minimum(pos, len(self.index) - 1)]
        if self.task_starts is not None:
            t = rng.integers(0, len(self.task_starts), size=k)
            start = self.task_starts[t]
            return self.index[rng.integers(start, start + self.task_sizes[t])]
        return self.index[rng.integers(0, len(self.index), size=k)]


@dataclass(frozen=True)
class _Plan:
    """Everything a draw needs, rebuilt once per catalog version."""

    version: int
    size: int
    groups: tuple[_Group, ...]
    weights: np.ndarray  # share of each group (ratios renormalised); empty groups left out


class Sampler:
    def __init__(self, settings: SamplerSettings) -> None:
        settings.validate()
        self.settings = settings
        self.plan: _Plan | None = None

    def draw(self, order: np.ndarray, source: np.ndarray, task: np.ndarray,
             batch_size: int, rng: np.random.Generator, version: int) -> np.ndarray:
        """Catalog indices (int64, length batch_size, with replacement)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not len(order) == len(source) == len(task):
            raise ValueError(f"catalog arrays differ in length: order {len(order)}, "
                             f"source {len(source)}, task {len(task)}")
        plan = self.plan
        if plan is None or plan.version != version or plan.size != len(order):
            plan = self.plan = self._build(np.asarray(order), np.asarray(source), np.asarray(task), version)
        if not plan.groups:
            raise ValueError(EMPTY)
        counts = split(plan.weights, batch_size)
        parts = [g.draw(int(k), rng) for g, k in zip(plan.groups, counts) if k]
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)).astype(np.int64, copy=False)

    def _build(self, order: np.ndarray, source: np.ndarray, task: np.ndarray, version: int) -> _Plan:
        mix = self.settings.mix
        if mix is None:
            members = [(np.arange(len(order), dtype=np.int64), 1.0)] if len(order) else []
        else:
            members = []
            for code, name in enumerate(SOURCES):
                if mix.get(name, 0) > 0:
                    index = np.flatnonzero(source == code).astype(np.int64, copy=False)
                    if len(index):
                        members.append((index, float(mix[name])))
        groups = tuple(self._prepare(index, order, task) for index, _ in members)
        weights = np.array([w for _, w in members], np.float64)
        return _Plan(version, len(order), groups, weights / weights.sum() if len(weights) else weights)

    def _prepare(self, index: np.ndarray, order: np.ndarray, task: np.ndarray) -> _Group:
        strategy = self.settings.strategy
        if strategy == "recency":
            age = (order[index[-1]] - order[index]).astype(np.float64)  # order increases: last is newest
            return _Group(index, cumulative=np.cumsum(np.exp2(-age / self.settings.recency_half_life)))
        if strategy == "task_balanced":
            perm = np.argsort(task[index], kind="stable")
            sorted_task = task[index][perm]
            starts = np.flatnonzero(np.r_[True, sorted_task[1:] != sorted_task[:-1]])
            sizes = np.diff(np.r_[starts, len(sorted_task)])
            return _Group(index[perm], task_starts=starts, task_sizes=sizes)
        return _Group(index)


def split(weights: np.ndarray, total: int) -> np.ndarray:
    """Largest-remainder rounding of `total * weights` (weights sum to 1); ties go to the first."""
    quotas = total * np.asarray(weights, np.float64)
    counts = np.floor(quotas).astype(np.int64)
    short = total - int(counts.sum())
    if short > 0:
        counts[np.argsort(-(quotas - counts), kind="stable")[:short]] += 1
    return counts
