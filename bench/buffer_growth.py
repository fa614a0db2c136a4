"""Does sampling slow down as the replay buffer grows? Sample time per batch of 256 while ingesting.

The buffer is filled to each size in turn (10k, 100k, 300k, 1M stored transitions of a small
state observation: 18 float32, like the reach arm). At each size the learner's pattern runs:
a 32-transition batch is added between two samples of 256, with a commit every `--commit-every`
batches, as the ingest's group commit does. Only `sample` is timed (the adds and commits are
reported apart). The RAM budget holds everything: the question is the cost of the sample
catalog, not of the disk.

Raw baseline, in the same run and at the same size: one in-RAM array per column holding that
many rows; a batch is obs[idx], obs[idx + 1] and the scalar columns for uniform random idx, the
same seven columns `PersistentReplay.sample` returns (obs/state, next_obs/state, action, reward,
terminated, policy_version, robot). Ours and raw alternate in rounds, so a busy machine slows
both alike, and raw samples follow the same 32-row add as ours (untimed there too), so both
gather with the CPU caches in the same state. Times are medians over the samples (mean shown too).

Goals: ours at 1M <= 1.5x ours at 10k; ours >= 0.7x raw in batches/s at every size.

Beyond the RAM budget (`--beyond`, `--budgets`): a second buffer holds `--beyond` transitions with
budgets smaller than the data, so the prefetcher swaps a cold segment in every `buffer.batches_per_swap`
(64) batches while the same add-then-sample pattern runs. A swap must cost O(the segment), not rebuild the catalog:
the median, p99 and maximum sample times are reported (and the adds', which wait on the same
lock in the learner). Goal: p99 <= 3x the median at every budget.

    python bench/buffer_growth.py [--sizes 10000,100000,300000,1000000] [--samples 2000]
                                  [--beyond 1500000 --budgets 48,200] [--out growth.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RawColumns, write_result  # noqa: E402

from user_rl.cloud.buffer.rows import row_bytes, segment_schema  # noqa: E402
from user_rl.cloud.buffer.store import PersistentReplay  # noqa: E402
from user_rl.config import BufferConfig  # noqa: E402
from user_rl.wire import user_rl_pb2 as pb  # noqa: E402
from user_rl.wire.transitions import FINAL_OBS, FINAL_ROW, OBS  # noqa: E402

OBS_SPACE = gym.spaces.Dict({"state": gym.spaces.Box(-10.0, 10.0, (18,), np.float32)})
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
MB = 2**20
GROWTH_GOAL = 1.5  # ours at the largest size / ours at the smallest
RAW_GOAL = 0.7  # ours / raw, batches per second
TAIL_GOAL = 3.0  # beyond the RAM budget: p99 / median sample time


class Robot:
    """Vectorised wire batches of one robot: episodes of `episode_len` steps, each ending truncated
    with a final observation; the state carries the global step number (so pairs can be checked)."""

    def __init__(self, episode_len: int = 200) -> None:
        self.episode_len = episode_len
        self.t = 0

    def batch(self, n: int) -> dict[str, np.ndarray]:
        t = self.t + np.arange(n)
        step = t % self.episode_len
        ends = step == self.episode_len - 1
        final_rows = np.flatnonzero(ends).astype(np.int64)
        state = np.repeat(t[:, None].astype(np.float32), 18, axis=1)
        cols = {
            OBS + "state": state,
            "action": np.zeros((n, 4), np.float32),
            "reward": np.ones(n, np.float32),
            "terminated": np.zeros(n, np.bool_),
            "truncated": ends,
            "episode": (t // self.episode_len).astype(np.uint64),
            "step": step.astype(np.int64),
            "policy_version": np.zeros(n, np.int64),
            "actor": np.full(n, pb.ACTOR_POLICY, np.uint8),
            "label": np.full(n, pb.LABEL_NONE, np.uint8),
            "sensor_time": np.zeros(n),
            FINAL_ROW: final_rows,
        }
        if len(final_rows):
            cols[FINAL_OBS + "state"] = state[final_rows] + 1
        self.t += n
        return cols


def raw_arrays(n: int) -> RawColumns:
    """The baseline's columns for `n` rows of random data (sampled from the first rows only: `first`)."""
    rng = np.random.default_rng(0)
    state = rng.standard_normal((n, 18)).astype(np.float32)
    action = rng.standard_normal((n, 4)).astype(np.float32)
    reward = rng.standard_normal(n).astype(np.float32)
    return RawColumns({"state": state}, action, reward, np.zeros(n, np.int64))


class Ingest:
    """Feeds the store as the ingest does: batches of `batch` rows, a commit every `commit_every`."""

    def __init__(self, store: PersistentReplay, commit_every: int) -> None:
        self.store, self.commit_every = store, commit_every
        self.stream = store.open_stream("robot-0", epoch=1)
        self.robot = Robot()
        self.seq = 0
        self.add_s = self.commit_s = 0.0
        self.adds = 0

    def add(self, rows: int, timed: bool = False) -> None:
        self.seq += 1
        cols = self.robot.batch(rows)
        t0 = time.perf_counter()
        self.store.add(self.stream, self.seq, cols)
        t1 = time.perf_counter()
        if self.seq % self.commit_every == 0:
            self.store.commit()
        if timed:
            self.add_s += t1 - t0
            self.commit_s += time.perf_counter() - t1
            self.adds += 1

    def fill_to(self, transitions: int, rows: int = 2048) -> None:
        while len(self.store) < transitions:
            self.add(min(rows, transitions - len(self.store) + 1))
        self.store.commit()


def measure(
    store: PersistentReplay, ingest: Ingest, raw: RawColumns, samples: int, batch: int, rounds: int, seed: int
) -> dict:
    """Ours (with a 32-row add between samples) and raw, alternating in `rounds`."""
    rng_ours, rng_raw = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    ours_t, raw_t = [], []
    per_round = max(1, samples // rounds)
    for _ in range(3):  # warm-up: first touches, the sampler's tables at this size
        store.sample(batch, rng_ours)
        raw.sample(batch, rng_raw)
    for _ in range(rounds):
        for _ in range(per_round):
            ingest.add(32, timed=True)
            t0 = time.perf_counter()
            out = store.sample(batch, rng_ours)
            ours_t.append(time.perf_counter() - t0)
        for _ in range(per_round):
            ingest.add(32)  # the same add, untimed: both sides sample with the CPU caches in the same state
            t0 = time.perf_counter()
            raw.sample(batch, rng_raw)
            raw_t.append(time.perf_counter() - t0)
    # Every sampled pair is a true one: next obs is the same robot's next step.
    assert np.all(out["next_obs/state"][:, 0] == out["obs/state"][:, 0] + 1), "a sampled pair is not consecutive"
    ours_ms, raw_ms = np.asarray(ours_t) * 1e3, np.asarray(raw_t) * 1e3
    return {
        "ours_ms": float(np.median(ours_ms)),
        "ours_mean_ms": float(ours_ms.mean()),
        "ours_p99_ms": float(np.percentile(ours_ms, 99)),
        "ours_max_ms": float(ours_ms.max()),
        "raw_ms": float(np.median(raw_ms)),
        "raw_mean_ms": float(raw_ms.mean()),
        "samples": len(ours_t),
    }


def beyond_budget(
    root: Path,
    transitions: int,
    budget_mb: float,
    segment_mb: float,
    samples: int,
    batch: int,
    commit_every: int,
    seed: int,
) -> dict:
    """Sample times (with a 32-row add before each) from a buffer `transitions` long whose RAM budget
    holds only part of it: the prefetcher swaps a segment in every `batches_per_swap` batches."""
    settings = BufferConfig(ram_budget_mb=budget_mb, segment_mb=segment_mb)
    store = PersistentReplay(root / f"beyond-{budget_mb:g}", OBS_SPACE, ACTION_SPACE, settings)
    try:
        ingest = Ingest(store, commit_every)
        t0 = time.perf_counter()
        ingest.fill_to(transitions)
        fill_s = time.perf_counter() - t0
        rng = np.random.default_rng(seed)
        for _ in range(3):
            store.sample(batch, rng)
        loads, looked_at, rebuilds = store.cache.slot_loads, store.cache.loaded_rows, store.cache.version
        swaps = store.prefetcher.swaps
        sample_t, add_t = [], []
        for _ in range(samples):
            t0 = time.perf_counter()
            ingest.add(32)
            t1 = time.perf_counter()
            out = store.sample(batch, rng)
            sample_t.append(time.perf_counter() - t1)
            add_t.append(t1 - t0)
            if store.prefetcher._want.is_set():  # give the loader thread its turn, as the learner's other threads do
                time.sleep(0)
        assert np.all(out["next_obs/state"][:, 0] == out["obs/state"][:, 0] + 1), "a sampled pair is not consecutive"
        ms, add_ms = np.asarray(sample_t) * 1e3, np.asarray(add_t) * 1e3
        swapped = store.prefetcher.swaps - swaps
        # The floor: the same pattern with swaps held off (what the machine's load alone does to the tail)
        store.prefetcher.samples_per_swap = 2**62
        floor_t = []
        for _ in range(samples):
            ingest.add(32)
            t1 = time.perf_counter()
            store.sample(batch, rng)
            floor_t.append(time.perf_counter() - t1)
        floor = np.asarray(floor_t) * 1e3
        return {
            "budget_mb": budget_mb,
            "stored": len(store),
            "fill_s": fill_s,
            "segments": len(store.segments) + 1,
            "cached_segments": len(store.cache.active()),
            "segment_rows": store.segment_rows,
            "samples": samples,
            "median_ms": float(np.median(ms)),
            "mean_ms": float(ms.mean()),
            "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max()),
            "p99_over_median": float(np.percentile(ms, 99) / np.median(ms)),
            "add_median_ms": float(np.median(add_ms)),
            "add_p99_ms": float(np.percentile(add_ms, 99)),
            "add_max_ms": float(add_ms.max()),
            "swaps": swapped,
            "no_swaps_median_ms": float(np.median(floor)),
            "no_swaps_p99_ms": float(np.percentile(floor, 99)),
            "no_swaps_max_ms": float(floor.max()),
            "slot_loads": store.cache.slot_loads - loads,
            "rows_looked_at_per_swap": (store.cache.loaded_rows - looked_at) / max(1, swapped),
            "catalog_rebuilds": store.cache.version - rebuilds,
        }
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,300000,1000000", help="stored transitions, comma separated")
    parser.add_argument(
        "--samples",
        type=int,
        default=400,
        help="timed samples per size and side (each after a 32-row add: the buffer grows by 2 x 32 x this meanwhile)",
    )
    parser.add_argument("--rounds", type=int, default=20, help="ours/raw alternations per size")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--commit-every", type=int, default=4, help="32-row adds per commit")
    parser.add_argument("--segment-mb", type=float, default=BufferConfig().segment_mb)
    parser.add_argument(
        "--beyond", type=int, default=1_500_000, help="transitions of the beyond-budget case (0: skip it)"
    )
    parser.add_argument(
        "--budgets", default="48,200", help="RAM budgets (MB) of the beyond-budget case, comma separated"
    )
    parser.add_argument("--beyond-samples", type=int, default=2000, help="timed samples per budget")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for the smoke test")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.samples, args.rounds, args.segment_mb = "2000,10000,30000", 30, 3, 0.25
        args.beyond, args.budgets, args.beyond_samples = 30000, "0.6", 200
    sizes = sorted(int(s) for s in args.sizes.split(","))

    per_row = row_bytes(segment_schema(OBS_SPACE, ACTION_SPACE))
    # Everything in RAM: the whole data (plus final-observation rows and the samples' own adds), two spare slots.
    growth_rows = 2 * args.samples * 32 * len(sizes)  # ours and raw rounds each add 32 rows per sample
    budget_mb = (1.2 * (sizes[-1] + growth_rows) * per_row + 4 * args.segment_mb * MB) / MB
    settings = BufferConfig(ram_budget_mb=budget_mb, segment_mb=args.segment_mb)
    raw_all = raw_arrays(sizes[-1] + growth_rows)
    load_before = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-growth-") as root:
        store = PersistentReplay(Path(root) / "buffer", OBS_SPACE, ACTION_SPACE, settings)
        ingest = Ingest(store, args.commit_every)
        for size in sizes:
            t0 = time.perf_counter()
            ingest.fill_to(size)
            fill_s = time.perf_counter() - t0
            raw = raw_all.first(len(store))  # the rows the buffer holds now (the baseline grows no further)
            ingest.add_s = ingest.commit_s = 0.0
            ingest.adds = 0
            stored_from = len(store)
            row = measure(store, ingest, raw, args.samples, args.batch, args.rounds, seed=size)
            row.update(
                {
                    "size": size,
                    "stored_from": stored_from,
                    "stored": len(store),
                    "fill_s": fill_s,
                    "segments": len(store.segments) + 1,
                    "cached_segments": len(store.cache.active()),
                    "catalog_rebuilds": store.cache.version,
                    "add_ms": 1e3 * ingest.add_s / ingest.adds,
                    "commit_ms_per_add": 1e3 * ingest.commit_s / ingest.adds,
                    "ratio_vs_raw": row["raw_ms"] / row["ours_ms"],
                }
            )
            results.append(row)
            print(f"  {size:>9,} stored: ours {row['ours_ms']:.3f} ms/sample, raw {row['raw_ms']:.3f}", flush=True)
        assert not store.prefetcher.cold(), "every segment should be in RAM"
        store.close()
        beyond = (
            [
                beyond_budget(
                    Path(root),
                    args.beyond,
                    float(b),
                    args.segment_mb,
                    args.beyond_samples,
                    args.batch,
                    args.commit_every,
                    seed=i,
                )
                for i, b in enumerate(args.budgets.split(","))
            ]
            if args.beyond
            else []
        )

    growth = results[-1]["ours_ms"] / results[0]["ours_ms"]
    worst = min(r["ratio_vs_raw"] for r in results)
    print(
        f"\nbatches of {args.batch} (obs + next obs of 18 float32, and the scalar columns); "
        f"a 32-transition add before each sample, a commit every {args.commit_every} adds; "
        f"RAM budget {budget_mb:,.0f} MB (all in RAM)"
    )
    print(f"load average before / after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores\n")
    print(
        "| stored transitions (during the measurement) | ours ms/sample (p50) | ours mean / p99 / max ms "
        "| raw ms/sample (p50) | ours/raw batches/s "
        "| add ms (32 rows) | commit ms per add | segments | catalog rebuilds |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['stored_from']:,}-{r['stored']:,} | {r['ours_ms']:.3f} | "
            f"{r['ours_mean_ms']:.3f} / {r['ours_p99_ms']:.3f} / {r['ours_max_ms']:.3f} | "
            f"{r['raw_ms']:.3f} | {r['ratio_vs_raw']:.2f} | {r['add_ms']:.3f} | {r['commit_ms_per_add']:.3f} | "
            f"{r['segments']} | {r['catalog_rebuilds']} |"
        )
    print()
    print(
        f"growth ratio ours {sizes[-1]:,} / {sizes[0]:,} = {growth:.2f} (goal <= {GROWTH_GOAL}): "
        f"{'met' if growth <= GROWTH_GOAL else 'NOT met'}"
    )
    print(
        f"ratio ours/raw at {sizes[-1]:,} = {results[-1]['ratio_vs_raw']:.2f}, worst over sizes {worst:.2f} "
        f"(goal >= {RAW_GOAL}): {'met' if worst >= RAW_GOAL else 'NOT met'}"
    )
    if beyond:
        print(
            f"\nbeyond the RAM budget: {args.beyond:,} transitions, segments of {args.segment_mb:g} MB, "
            f"{args.beyond_samples} samples of {args.batch} per budget, a 32-row add before each\n"
        )
        print(
            "| RAM budget MB | cached / segments | sample ms p50 | p99 | max | mean | p99/p50 "
            "| no swaps: p50 / p99 / max "
            "| add ms p50 / p99 / max | swaps | rows looked at per swap | catalog rebuilds |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in beyond:
            print(
                f"| {r['budget_mb']:g} | {r['cached_segments']} / {r['segments']} | {r['median_ms']:.3f} | "
                f"{r['p99_ms']:.3f} | {r['max_ms']:.3f} | {r['mean_ms']:.3f} | {r['p99_over_median']:.2f} | "
                f"{r['no_swaps_median_ms']:.3f} / {r['no_swaps_p99_ms']:.3f} / {r['no_swaps_max_ms']:.3f} | "
                f"{r['add_median_ms']:.3f} / {r['add_p99_ms']:.3f} / {r['add_max_ms']:.3f} | {r['swaps']} | "
                f"{r['rows_looked_at_per_swap']:,.0f} | {r['catalog_rebuilds']} |"
            )
        tail = max(r["p99_over_median"] for r in beyond)
        print(
            f"\nbeyond the budget: worst p99 / median = {tail:.2f} (goal <= {TAIL_GOAL}): "
            f"{'met' if tail <= TAIL_GOAL else 'NOT met'}"
        )
    result = {
        "config": {
            "sizes": sizes,
            "samples": args.samples,
            "rounds": args.rounds,
            "batch": args.batch,
            "commit_every": args.commit_every,
            "segment_mb": args.segment_mb,
            "row_bytes": per_row,
            "ram_budget_mb": budget_mb,
        },
        "load_average": [load_before[0], os.getloadavg()[0]],
        "cpus": os.cpu_count(),
        "sizes": results,
        "growth_ratio": growth,
        "growth_goal": GROWTH_GOAL,
        "ratio_vs_raw": results[-1]["ratio_vs_raw"],
        "worst_ratio_vs_raw": worst,
        "raw_goal": RAW_GOAL,
        "beyond_budget": {"transitions": args.beyond, "cases": beyond, "tail_goal": TAIL_GOAL},
    }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
