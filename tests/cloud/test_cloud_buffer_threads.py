"""PersistentReplay with an ingest thread and a sampler thread at once (the learner's model).

The writer thread appends, commits, seals small segments, evicts over a disk limit and cuts
episodes with new epochs; the sampler thread samples all along while the prefetcher rotates
segments through a small cache. Every sampled transition must be a true one (next observation
of the same robot and episode, one step later; no torn rows), and neither thread may raise.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from test_cloud_store import ACTION_SPACE, OBS_SPACE, Robot, Writer, check_batch, open_store, segment_bytes

from user_rl.cloud.buffer.rows import row_bytes, segment_schema

SLOT_MB = 256 * row_bytes(segment_schema(OBS_SPACE, ACTION_SPACE)) / 2**20


def test_ingest_and_sampling_threads_never_see_a_torn_or_wrong_transition(tmp_path: Path) -> None:
    size = segment_bytes(tmp_path)
    store = open_store(tmp_path / "buf", ram_budget_mb=4.5 * SLOT_MB, max_disk_gb=12 * size / 2**30)
    writer = Writer(store)
    robots = [Robot(rid) for rid in range(1, 5)]
    writer.add(robots[0], 20)
    store.commit()
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = {"batches": 0, "samples": 0, "transitions": 0}

    def ingest() -> None:
        try:
            i = 0
            while not stop.is_set():
                robot = robots[i % len(robots)]
                writer.add(robot, 5 + (7 * i) % 40, epoch=1 + i // 400)  # a new epoch now and then
                if i % 3 == 2:
                    store.commit()
                counts["batches"] += 1
                i += 1
            store.commit()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    def sample() -> None:
        rng = np.random.default_rng(0)
        try:
            while not stop.is_set():
                batch = store.sample(64, rng)
                check_batch(batch)
                counts["samples"] += 1
                counts["transitions"] += len(batch["reward"])
                len(store)
                store.stats()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=ingest), threading.Thread(target=sample)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 300  # a safety net on a busy machine, not a timing assertion
    while time.monotonic() < deadline and not errors and (counts["batches"] < 1500 or counts["samples"] < 1500):
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(30)
    print(
        f"{counts['batches']} batches written, {counts['samples']} batches sampled "
        f"({counts['transitions']} transitions checked), {store.prefetcher.swaps} prefetch swaps, "
        f"{len(store.index.segments(status='evicted'))} segments evicted, catalog rebuilt {store.cache.version} times"
    )
    assert not errors, repr(errors[0])
    assert counts["batches"] >= 1500 and counts["samples"] >= 1500
    assert store.prefetcher.swaps > 0 and store.index.segments(status="evicted"), "rotation and eviction both ran"
    assert store.thread_errors() == {}
    store.close()
    reopened = open_store(tmp_path / "buf")
    assert reopened.batch_keys() == writer.keys, "every batch written by the ingest thread is durable and known"
    reopened.close()
