"""Sampling beyond the RAM budget stays flat: a segment swapped into the RAM cache replaces its
own slot's block of the sample catalog (prepared by the prefetcher before the swap), never the
whole catalog. Counted, not timed: the rows a swap looks at are one segment's, and the catalog
kept this way is exactly the one a rebuild from scratch gives."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from test_cloud_store import ACTION_SPACE, OBS_SPACE, Robot, Writer, check_batch, open_store

from user_rl.cloud.buffer.rows import row_bytes, segment_schema


def tables(store) -> list[dict]:
    """Each sampler group's entries per cache slot (sorted rows; recency: normalised weights)."""
    out = []
    for group in store.cache.plan.groups:
        per_slot = {}
        for slot in store.cache.active():
            n = int(group.count[slot])
            order = np.argsort(group.rows[slot, :n], kind="stable")
            entry = {"rows": group.rows[slot, :n][order].tolist()}
            if group.strategy == "recency" and n:
                weights = np.diff(np.concatenate([[0.0], group.cumulative[slot, :n]]))
                entry["weights"] = (weights / weights.sum())[order]
            if group.strategy == "task_balanced":
                entry["tasks"] = {t: sorted(g.rows[slot, : g.count[slot]].tolist()) for t, g in group.by_task.items()}
            per_slot[store.cache.info[slot].segment] = entry
        out.append(per_slot)
    return out


@pytest.mark.parametrize("strategy", ["uniform", "recency", "task_balanced"])
def test_a_segment_swap_rebuilds_one_slot_not_the_catalog(tmp_path: Path, strategy: str) -> None:
    slot_mb = 256 * row_bytes(segment_schema(OBS_SPACE, ACTION_SPACE)) / 2**20
    budget = {"ram_budget_mb": 4.5 * slot_mb, "strategy": strategy, "recency_half_life": 300}
    store = open_store(tmp_path, **budget)
    writer, robots = Writer(store), [Robot(1), Robot(2)]
    for i in range(120):
        writer.add(robots[i % 2], 40, task=("reach", "push")[i % 2])
    store.close()
    store = open_store(tmp_path, **budget)  # reopened: 4 of ~19 segments in RAM, the rest cold
    try:
        cache = store.cache
        assert len(store.segments) >= 15 and len(cache.active()) == 4
        version, loads, looked_at = cache.version, getattr(cache, "slot_loads", 0), getattr(cache, "loaded_rows", 0)
        rng = np.random.default_rng(0)
        deadline = time.monotonic() + 20
        while store.prefetcher.swaps < 6 and time.monotonic() < deadline:
            check_batch(store.sample(64, rng))
            time.sleep(0.001)  # the loader thread's turn, as an update's would be
        swaps = store.prefetcher.swaps
        assert swaps >= 6
        assert cache.version == version, "a swap must not rebuild the whole catalog"
        assert cache.slot_loads - loads == swaps  # one slot's block per swap...
        assert cache.loaded_rows - looked_at <= swaps * store.segment_rows  # ...built from one segment's rows
        kept, size = tables(store), len(cache.plan)
        cache.invalidate()  # from scratch
        assert_same(tables(store), kept)
        assert len(cache.plan) == size == cache.catalog_size()
    finally:
        store.close()


def assert_same(a: list[dict], b: list[dict]) -> None:
    """Equal, up to float rounding of the recency weights."""
    for ga, gb in zip(a, b, strict=True):
        assert ga.keys() == gb.keys()
        for segment in ga:
            ea, eb = ga[segment], gb[segment]
            assert ea["rows"] == eb["rows"] and ea.get("tasks") == eb.get("tasks")
            if "weights" in ea:
                np.testing.assert_allclose(ea["weights"], eb["weights"], rtol=1e-9)
