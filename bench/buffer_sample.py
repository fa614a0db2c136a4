"""Sampling rate of PersistentReplay (batches of 256 image transitions), as a ratio to a numpy gather.

Raw baseline, in the same run: every column in one in-RAM array (obs [N,84,84,3] and the others);
a batch is obs[idx], obs[idx+1] and the scalar columns for uniform random idx, the same nine
columns `PersistentReplay.sample` returns (obs/*, next_obs/*, action, reward, terminated,
policy_version, robot).

Two cases, each timed for `--seconds` right after its own baseline measurement:
(a) warm: the buffer holds the data in its RAM budget (sampled from the store that was just filled);
(b) cold, data = 3x the RAM budget: the filled store is closed, every segment file is dropped from
    the page cache, the store reopened with `ram_budget_mb` = a third of the data (its crc check at
    open reads every file, so they are dropped again), then sampled while the prefetcher rotates
    segments through the cache. Reported: swaps, and the fraction of all segments that sampled
    batches touched (segment of a transition = where its batch was written; `policy_version`
    carries the batch number).

    python bench/buffer_sample.py [--transitions 28000] [--seconds 8] [--out sample.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from buffer_insert import ACTION_SPACE, MB, OBS_SPACE, Robot  # noqa: E402
from common import RawColumns, write_result  # noqa: E402

from user_rl.cloud.buffer.rows import row_bytes, segment_schema  # noqa: E402
from user_rl.cloud.buffer.segment import drop_from_page_cache  # noqa: E402
from user_rl.cloud.buffer.store import PersistentReplay  # noqa: E402
from user_rl.config import BufferConfig  # noqa: E402

GOALS = {"warm": 0.7, "cold_3x": 0.5}


def fill(
    directory: Path, transitions: int, episode_len: int, settings: BufferConfig
) -> tuple[PersistentReplay, np.ndarray, Robot]:
    """A filled store, and the segment each batch (policy_version) went to."""
    store = PersistentReplay(directory, OBS_SPACE, ACTION_SPACE, settings)
    fill_batch = min(256, store.segment_rows // 4)  # never split across segments
    stream = store.open_stream("robot-0", epoch=1)
    robot = Robot(episode_len)
    segment_of_batch = []
    for seq in range(1, transitions // fill_batch + 1):
        store.add(stream, seq, robot.batch(fill_batch))
        segment_of_batch.append(store.open_id)  # add seals first when a batch does not fit
        if seq % 8 == 0:
            store.commit()
    store.commit()
    return store, np.asarray(segment_of_batch), robot


def raw_arrays(robot: Robot, n: int) -> RawColumns:
    """The baseline's columns: the robot's `n` rows in RAM."""
    frame = np.arange(n) % len(robot.frames)
    obs = {"pixels": robot.frames[frame], "state": robot.states[frame]}
    return RawColumns(obs, robot.actions[frame], robot.states[frame, 0].copy(), np.arange(n, dtype=np.int64))


def timed(sample, batch: int, seconds: float, seed: int, on_batch=None) -> dict:
    rng = np.random.default_rng(seed)
    for _ in range(3):
        sample(batch, rng)
    latencies, bookkeeping = [], 0.0
    start = time.perf_counter()
    while time.perf_counter() - start - bookkeeping < seconds:
        t0 = time.perf_counter()
        out = sample(batch, rng)
        t1 = time.perf_counter()
        latencies.append(t1 - t0)
        if on_batch is not None:
            on_batch(out)
            bookkeeping += time.perf_counter() - t1
    wall = time.perf_counter() - start - bookkeeping  # the benchmark's own bookkeeping is not the buffer's
    ms = np.asarray(latencies) * 1e3
    return {
        "batches": len(latencies),
        "batches_per_s": len(latencies) / wall,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transitions", type=int, default=28_000, help="stored transitions (~21.5 KB each)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement (4 measurements)")
    parser.add_argument("--episode-len", type=int, default=100)
    parser.add_argument("--segment-mb", type=float, default=BufferConfig().segment_mb)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for the smoke test")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.transitions, args.seconds, args.segment_mb = 3000, 0.3, 4.0

    cases = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-sample-") as root:
        directory = Path(root) / "buffer"
        # (a) warm: a budget that holds everything, sampled from the store that was just filled.
        per_row = row_bytes(segment_schema(OBS_SPACE, ACTION_SPACE))
        warm_budget = max(BufferConfig().ram_budget_mb, 2 * args.transitions * per_row / MB)
        t0 = time.perf_counter()
        store, segment_of_batch, robot = fill(
            directory,
            args.transitions,
            args.episode_len,
            BufferConfig(ram_budget_mb=warm_budget, segment_mb=args.segment_mb),
        )
        fill_s = time.perf_counter() - t0
        assert not store.prefetcher.cold(), "warm case: every segment should be cached"
        raw = raw_arrays(robot, len(store))
        cases["warm"] = {
            "raw": timed(raw.sample, args.batch, args.seconds, 1),
            "ours": timed(store.sample, args.batch, args.seconds, 2),
            "ram_budget_mb": warm_budget,
            "cached_segments": len(store.cache.active()),
        }
        store.close()

        # (b) data = 3x the RAM budget, read from disk through the prefetcher.
        files = sorted(directory.glob("seg-*.seg"))
        data_mb = sum(r.rows for r in store.segments.values()) * per_row / MB
        for f in files:
            drop_from_page_cache(f)
        t0 = time.perf_counter()
        store = PersistentReplay(
            directory, OBS_SPACE, ACTION_SPACE, BufferConfig(ram_budget_mb=data_mb / 3, segment_mb=args.segment_mb)
        )
        open_s = time.perf_counter() - t0
        for f in files:
            drop_from_page_cache(f)
        cached_at_start = sum(store.cache.info[i].segment in store.segments for i in store.cache.active())
        seen: set[int] = set()

        def note(batch: dict) -> None:
            seen.update(segment_of_batch[np.unique(batch["policy_version"])].tolist())

        cold = {
            "raw": timed(raw.sample, args.batch, args.seconds, 3),
            "ours": timed(store.sample, args.batch, args.seconds, 4, note),
        }
        cold.update(
            {
                "ram_budget_mb": data_mb / 3,
                "data_mb": data_mb,
                "segments": len(files),
                "cache_slots": store.cache.slots - 1,
                "cached_segments_at_start": cached_at_start,
                "swaps": store.prefetcher.swaps,
                "distinct_segments_sampled": len(seen),
                "fraction_segments_sampled": len(seen) / len(files),
                "reopen_s": open_s,
            }
        )
        cases["cold_3x"] = cold
        store.close()

    for name, case in cases.items():
        case["ratio"] = case["ours"]["batches_per_s"] / case["raw"]["batches_per_s"]
        case["goal"] = GOALS[name]
    mb_per_batch = 2 * args.batch * per_row / MB
    print(
        f"{len(raw.reward):,} transitions ({data_mb:,.0f} MB stored, {len(files)} segments, "
        f"filled in {fill_s:.1f} s); batches of {args.batch} (~{mb_per_batch:.1f} MB of obs + next obs each)"
    )
    print(f"load average before / after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print()
    print(
        "| case | RAM budget MB | raw batches/s | ours batches/s | ours/raw | goal "
        "| ours p50 / p99 / max ms | raw p50 / p99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, c in cases.items():
        o, r = c["ours"], c["raw"]
        print(
            f"| {name} | {c['ram_budget_mb']:,.0f} | {r['batches_per_s']:,.1f} | {o['batches_per_s']:,.1f} | "
            f"{c['ratio']:.3f} | {c['goal']} | {o['p50_ms']:.1f} / {o['p99_ms']:.1f} / {o['max_ms']:.1f} | "
            f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} |"
        )
    c = cases["cold_3x"]
    print()
    print(
        f"cold_3x: reopen {c['reopen_s']:.1f} s; {c['cache_slots']} cache slots (one holds the empty open "
        f"segment; {c['cached_segments_at_start']} segments cached at start); {c['swaps']} swaps in "
        f"{c['ours']['batches']} batches; {c['distinct_segments_sampled']}/{c['segments']} segments sampled "
        f"({c['fraction_segments_sampled']:.0%})"
    )
    for name, c in cases.items():
        verdict = "met" if c["ratio"] >= c["goal"] else "NOT met"
        print(f"ratio {name} = {c['ratio']:.3f} (goal >= {c['goal']}): {verdict}")

    result = {
        "config": {
            "transitions": len(raw.reward),
            "batch": args.batch,
            "seconds": args.seconds,
            "episode_len": args.episode_len,
            "segment_mb": args.segment_mb,
            "row_bytes": per_row,
        },
        "fill_s": fill_s,
        "load_average": [load_before[0], os.getloadavg()[0]],
        "cpus": os.cpu_count(),
        "cases": cases,
    }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
