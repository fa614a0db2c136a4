"""Durable insert rate of 84x84x3 image transitions into PersistentReplay, as a ratio to raw memmap writes.

Ours: wire batches (`--batch` transitions each, episodes of `--episode-len` steps ending in a final
observation) go through `PersistentReplay.add` then `commit()` after every batch, as the learner's
group commit does at its interval: after each commit the batch is durable (segment fdatasync +
commit-log fsync; sealing a full segment adds crc, fsync, rename and an index transaction).

Raw baseline, in the same run: the same number of bytes per batch that ours stored (its segment rows
x row bytes: records, final observations, carried rows and row bookkeeping) copied from the batch's
arrays into one preallocated `np.memmap` file, with `.flush()` (msync) after every batch, so both are
durable at the same granularity. Only add+commit and copy+flush are timed; building the batches is
not. Each side gets a fresh directory under one temp dir (same filesystem), removed afterwards.
A second reference, `pwrite`, writes the same bytes with os.pwrite + fdatasync (what the segment
writer itself does, minus everything else): mmap writes pay a page fault per 4 KiB page, so the
memmap baseline is the slower of the two. Each repeat runs ours, raw, pwrite in that order; the
table shows every repeat and the medians (the ratio is the median of per-repeat ratios). The first
repeat in a fresh process is usually slowest: the store's RAM cache (lazy np.zeros slots) pays
first-touch page faults there; the `add s` column shows it.

    python bench/buffer_insert.py [--batch 64] [--transitions 20000] [--repeats 3] [--out insert.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from user_rl.cloud.buffer.rows import row_bytes  # noqa: E402
from user_rl.cloud.buffer.store import PersistentReplay  # noqa: E402
from user_rl.config import BufferConfig  # noqa: E402
from user_rl.wire import user_rl_pb2 as pb  # noqa: E402
from user_rl.wire.transitions import FINAL_OBS, FINAL_ROW, OBS  # noqa: E402

OBS_SPACE = gym.spaces.Dict(
    {
        "pixels": gym.spaces.Box(0, 255, (84, 84, 3), np.uint8),
        "state": gym.spaces.Box(-1.0, 1.0, (8,), np.float32),
    }
)
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
MB = 2**20
GOAL = 0.5


class Robot:
    """Wire batches of one simulated robot, built vectorised from a pool of random frames.

    Transition t shows frame t % pool; episodes last `episode_len` steps and end truncated, with a
    final observation. `policy_version` carries the batch number (the sample benchmark uses it).
    """

    def __init__(self, episode_len: int = 100, pool: int = 512, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.frames = rng.integers(0, 256, (pool, 84, 84, 3), dtype=np.uint8)
        self.states = rng.uniform(-1, 1, (pool, 8)).astype(np.float32)
        self.actions = rng.uniform(-1, 1, (pool, 4)).astype(np.float32)
        self.episode_len = episode_len
        self.t = 0
        self.batches = 0

    def batch(self, n: int) -> dict[str, np.ndarray]:
        t = self.t + np.arange(n)
        frame = t % len(self.frames)
        step = t % self.episode_len
        ends = step == self.episode_len - 1
        final_rows = np.flatnonzero(ends).astype(np.int64)
        after = (t[final_rows] + 1) % len(self.frames)
        cols = {
            OBS + "pixels": self.frames[frame],
            OBS + "state": self.states[frame],
            "action": self.actions[frame],
            "reward": self.states[frame, 0].copy(),
            "terminated": np.zeros(n, np.bool_),
            "truncated": ends,
            "episode": (t // self.episode_len).astype(np.uint64),
            "step": step.astype(np.int64),
            "policy_version": np.full(n, self.batches, np.int64),
            "actor": np.full(n, pb.ACTOR_POLICY, np.uint8),
            "label": np.full(n, pb.LABEL_NONE, np.uint8),
            "sensor_time": np.full(n, time.time()),
            FINAL_ROW: final_rows,
        }
        if len(final_rows):
            cols[FINAL_OBS + "pixels"], cols[FINAL_OBS + "state"] = self.frames[after], self.states[after]
        self.t += n
        self.batches += 1
        return cols


def stored_rows(store: PersistentReplay) -> int:
    """Rows written so far: sealed segments of this run plus the open one."""
    return sum(r.rows for i, r in store.segments.items() if i not in store.attached) + store.writer.rows


def run_ours(directory: Path, batches: list[dict], settings: BufferConfig) -> dict:
    store = PersistentReplay(directory, OBS_SPACE, ACTION_SPACE, settings)
    stream = store.open_stream("robot-0", epoch=1)
    per_row = row_bytes(store.schema)
    add_s = commit_s = 0.0
    batch_bytes = []
    for seq, cols in enumerate(batches, start=1):
        before = stored_rows(store)
        t0 = time.perf_counter()
        store.add(stream, seq, cols)
        t1 = time.perf_counter()
        acked = store.commit()
        t2 = time.perf_counter()
        assert acked and stream.durable_seq == seq
        add_s, commit_s = add_s + t1 - t0, commit_s + t2 - t1
        batch_bytes.append((stored_rows(store) - before) * per_row)
    t0 = time.perf_counter()
    segments = len(store.segments)
    store.close()
    return {
        "seconds": add_s + commit_s,
        "add_s": add_s,
        "commit_s": commit_s,
        "close_s": time.perf_counter() - t0,
        "bytes": sum(batch_bytes),
        "batch_bytes": batch_bytes,
        "row_bytes": per_row,
        "sealed_segments": segments,
    }


def batch_chunks(cols: dict[str, np.ndarray], nbytes: int) -> list[np.ndarray]:
    """`nbytes` bytes of the batch's own arrays, repeated when ours stored more than the wire carried."""
    sources = [v.reshape(-1).view(np.uint8) for k, v in cols.items() if k != FINAL_ROW]
    chunks, done = [], 0
    while done < nbytes:
        for src in sources:
            chunks.append(src[: min(len(src), nbytes - done)])
            done += len(chunks[-1])
            if done == nbytes:
                break
    return chunks


def run_raw(path: Path, batches: list[dict], batch_bytes: list[int]) -> dict:
    """The baseline: copy into a preallocated np.memmap, `.flush()` (msync) after every batch."""
    mm = np.memmap(path, np.uint8, "w+", shape=(sum(batch_bytes),))
    seconds, offset = 0.0, 0
    for cols, nbytes in zip(batches, batch_bytes):
        chunks = batch_chunks(cols, nbytes)
        t0 = time.perf_counter()
        for chunk in chunks:
            mm[offset : offset + len(chunk)] = chunk
            offset += len(chunk)
        mm.flush()
        seconds += time.perf_counter() - t0
    del mm
    return {"seconds": seconds, "bytes": offset}


def run_pwrite(path: Path, batches: list[dict], batch_bytes: list[int]) -> dict:
    """A second reference: os.pwrite into a preallocated (sparse) file, fdatasync after every batch."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.ftruncate(fd, sum(batch_bytes))
    seconds, offset = 0.0, 0
    try:
        for cols, nbytes in zip(batches, batch_bytes):
            chunks = batch_chunks(cols, nbytes)
            t0 = time.perf_counter()
            for chunk in chunks:
                os.pwrite(fd, chunk, offset)
                offset += len(chunk)
            os.fdatasync(fd)
            seconds += time.perf_counter() - t0
    finally:
        os.close(fd)
    return {"seconds": seconds, "bytes": offset}


def rates(result: dict, transitions: int) -> dict:
    return {"transitions_per_s": transitions / result["seconds"], "mb_per_s": result["bytes"] / MB / result["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64, help="transitions per batch (one commit each)")
    parser.add_argument("--transitions", type=int, default=20_000)
    parser.add_argument("--episode-len", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for the smoke test")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.transitions, args.batch, args.repeats = 600, 32, 1

    robot = Robot(args.episode_len)
    batches = [robot.batch(args.batch) for _ in range(max(1, args.transitions // args.batch))]
    transitions = sum(len(b["reward"]) for b in batches)
    wire_bytes = sum(v.nbytes for k, v in batches[0].items() if k != FINAL_ROW) / len(batches[0]["reward"])

    runs = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-insert-") as root:
        for r in range(args.repeats):
            ours_dir, raw_file, pwrite_file = (Path(root) / f"{name}-{r}" for name in ("ours", "raw", "pwrite"))
            ours = run_ours(ours_dir, batches, BufferConfig())
            raw = run_raw(raw_file, batches, ours["batch_bytes"])
            pwrite = run_pwrite(pwrite_file, batches, ours["batch_bytes"])
            assert raw["bytes"] == pwrite["bytes"] == ours["bytes"]
            shutil.rmtree(ours_dir)
            raw_file.unlink()
            pwrite_file.unlink()
            del ours["batch_bytes"]
            run = {
                "ours": {**rates(ours, transitions), **ours},
                "raw": {**rates(raw, transitions), **raw},
                "pwrite": {**rates(pwrite, transitions), **pwrite},
            }
            run["ratio"] = run["ours"]["transitions_per_s"] / run["raw"]["transitions_per_s"]
            run["ratio_vs_pwrite"] = run["ours"]["transitions_per_s"] / run["pwrite"]["transitions_per_s"]
            runs.append(run)

    sides = ("ours", "raw", "pwrite")
    median = {
        side: {k: statistics.median(r[side][k] for r in runs) for k in ("transitions_per_s", "mb_per_s")}
        for side in sides
    }
    ratio = statistics.median(r["ratio"] for r in runs)
    ratio_pwrite = statistics.median(r["ratio_vs_pwrite"] for r in runs)
    stored_per_transition = runs[0]["ours"]["bytes"] / transitions
    print(
        f"{transitions:,} transitions in batches of {args.batch}, commit after each; "
        f"{stored_per_transition:,.0f} B stored per transition ({wire_bytes:,.0f} B on the wire)"
    )
    print(f"load average before / after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("raw = np.memmap copy + flush (the baseline); pwrite = os.pwrite + fdatasync (a second reference)")
    print()
    print(
        "| repeat | ours tr/s | ours MB/s | raw tr/s | raw MB/s | pwrite tr/s | pwrite MB/s "
        "| ours/raw | ours/pwrite | ours add s | ours commit s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = [
        (
            str(i),
            r["ours"],
            r["raw"],
            r["pwrite"],
            r["ratio"],
            r["ratio_vs_pwrite"],
            f"{r['ours']['add_s']:.2f}",
            f"{r['ours']['commit_s']:.2f}",
        )
        for i, r in enumerate(runs)
    ]
    rows.append(("median", median["ours"], median["raw"], median["pwrite"], ratio, ratio_pwrite, "", ""))
    for name, o, w, p, q, qp, add_s, commit_s in rows:
        print(
            f"| {name} | {o['transitions_per_s']:,.0f} | {o['mb_per_s']:,.1f} | {w['transitions_per_s']:,.0f} | "
            f"{w['mb_per_s']:,.1f} | {p['transitions_per_s']:,.0f} | {p['mb_per_s']:,.1f} | {q:.3f} | {qp:.3f} "
            f"| {add_s} | {commit_s} |"
        )
    print()
    print(
        f"ratio ours/raw = {ratio:.3f} (goal >= {GOAL}): {'met' if ratio >= GOAL else 'NOT met'}; "
        f"ours/pwrite = {ratio_pwrite:.3f}"
    )

    result = {
        "config": {
            "batch": args.batch,
            "transitions": transitions,
            "episode_len": args.episode_len,
            "repeats": args.repeats,
            "buffer": BufferConfig().model_dump(),
        },
        "load_average": [load_before[0], os.getloadavg()[0]],
        "cpus": os.cpu_count(),
        "stored_bytes_per_transition": stored_per_transition,
        "wire_bytes_per_transition": wire_bytes,
        "ours": median["ours"],
        "raw": median["raw"],
        "pwrite": median["pwrite"],
        "ratio": ratio,
        "ratio_vs_pwrite": ratio_pwrite,
        "goal": GOAL,
        "runs": runs,
    }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
