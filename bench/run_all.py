"""Run every benchmark and gather one table: `python bench/run_all.py`.

Each benchmark runs as its own process with the settings below (chosen so that all of them take
under 30 minutes on a 2-core machine), writes `bench/results/<name>.json`, and gives the table
its headline figures: ours, the raw baseline measured in the same run, and their ratio. The table
goes to `bench/results/RESULTS.md` and to the screen. A benchmark that fails is a row saying so;
the others still run.

    python bench/run_all.py                     # everything (~20-30 min here)
    python bench/run_all.py --only transport weight_sync
    python bench/run_all.py --quick             # every benchmark at its smoke-test size
    python bench/run_all.py --table-only        # the table again, from the JSON in bench/results

A long benchmark (sample_efficiency: hours) runs only with --quick or when --only names it; a full
run keeps its rows from the JSON its own run left in bench/results. A GPU benchmark (gpu_updates)
runs where CUDA is available; elsewhere the table keeps the rows of its last run (on a GPU box).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
Row = tuple[str, str, str, str]  # figure, ours, baseline, ratio


@dataclass
class Benchmark:
    script: str
    args: list[str]
    rows: Callable[[dict], list[Row]]
    quick: list[str] = field(default_factory=lambda: ["--quick"])
    long: bool = False  # hours at full size: a full run_all shows its last JSON instead of running it
    gpu: bool = False  # needs CUDA: without it, run_all shows its last JSON instead of running it


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def transport_rows(r: dict) -> list[Row]:
    rates = r["transitions_per_s"]
    return [
        (
            "84x84x3 transitions/s edge -> learner, durable and acked, vs plain PUSH/PULL",
            f"{rates['ours']:,.0f}",
            f"{rates['plain']:,.0f}",
            _x(r["ours_vs_plain"]),
        ),
        (
            "... vs torch.save over gRPC (LeRobot's actor/learner style)",
            f"{rates['ours']:,.0f}",
            f"{rates['grpc_torch_save']:,.0f}",
            _x(r["ours_vs_grpc_torch_save"]),
        ),
    ]


def weight_sync_rows(r: dict) -> list[Row]:
    rows = []
    for size in r["results"]:
        rows.append(
            (
                f"{size['params'] / 1e6:.0f}M bf16 params to {size['edges']} edges, applied (s) vs one plain copy",
                f"{size['ours_s']:.2f}",
                f"{size['plain_s']:.2f}",
                _x(size["ratio_vs_plain"]),
            )
        )
        rows.append(
            (
                "50 Hz loop p99 jitter (ms) during that sync vs between syncs",
                f"{size['jitter_p99_ms_during_sync']:.1f}",
                f"{size['jitter_p99_ms_quiet']:.1f}",
                "-",
            )
        )
    return rows


def buffer_insert_rows(r: dict) -> list[Row]:
    return [
        (
            "durable image inserts (transitions/s) vs raw np.memmap writes",
            f"{r['ours']['transitions_per_s']:,.0f}",
            f"{r['raw']['transitions_per_s']:,.0f}",
            _x(r["ratio"]),
        )
    ]


def buffer_sample_rows(r: dict) -> list[Row]:
    return [
        (
            f"batches of 256/s ({name}) vs a numpy gather in RAM",
            f"{case['ours']['batches_per_s']:,.1f}",
            f"{case['raw']['batches_per_s']:,.1f}",
            _x(case["ratio"]),
        )
        for name, case in r["cases"].items()
    ]


def buffer_growth_rows(r: dict) -> list[Row]:
    return [
        (
            f"sample ms per batch at {row['size']:,} stored, ingest interleaved, vs numpy gather",
            f"{row['ours_ms']:.2f}",
            f"{row['raw_ms']:.2f}",
            _x(row["ratio_vs_raw"]),
        )
        for row in r["sizes"]
    ]


def link_encryption_rows(r: dict) -> list[Row]:
    rows = [
        (
            f"{name} messages/s with CurveZMQ vs in the clear",
            f"{row['curve_msgs_per_s']:,.0f}",
            f"{row['clear_msgs_per_s']:,.0f}",
            _x(row["ratio"]),
        )
        for name, row in r.items()
        if "curve_msgs_per_s" in row
    ]
    ceiling = r.get("crypto_ceiling")
    if ceiling:  # what one core of libsodium allows, against the clear loopback link
        rows.append(
            (
                "image batch messages/s libsodium's cipher allows on one core (CurveZMQ's ceiling) vs in the clear",
                f"{ceiling['msgs_per_s']:,.0f}",
                f"{r['image batch']['clear_msgs_per_s']:,.0f}",
                _x(ceiling["vs_clear"]),
            )
        )
    return rows


def policy_updates_rows(r: dict, name: str = "") -> list[Row]:
    c = r["config"]
    rows = [
        (
            f"{c['algo']}{f' ({name})' if name else ''} updates/s, batch {c['batch']}, {c['device_name']}, "
            "vs a plain PyTorch step",
            f"{r['ours']['updates_per_s']:.1f}",
            f"{r['raw']['updates_per_s']:.1f}",
            _x(r["ratio"]),
        )
    ]
    if "plain_sac" in r:
        rows.append(
            (
                "... vs the plain SAC loop (CleanRL's shape)",
                f"{r['ours']['updates_per_s']:.1f}",
                f"{r['plain_sac']['updates_per_s']:.1f}",
                _x(r["ratio_vs_plain_sac"]),
            )
        )
    if "eager" in r:
        rows.append(
            (
                "... as a CUDA graph vs the same update as written"
                + ("" if r.get("cuda_graph", {}).get("captured") else " (not captured: runs as written)"),
                f"{r['ours']['updates_per_s']:.1f}",
                f"{r['eager']['updates_per_s']:.1f}",
                _x(r["ratio_vs_eager"]),
            )
        )
    if "lean_sac" in r:
        compiled = "compiled, " if r["lean_sac"]["compiled"] else "not compiled, "
        rows.append(
            (
                f"... vs a LeanRL-style SAC ({compiled}a CUDA graph, batches on the GPU: bench/lean_sac.py)",
                f"{r['ours']['updates_per_s']:.1f}",
                f"{r['lean_sac']['updates_per_s']:.1f}",
                _x(r["ratio_vs_lean_sac"]),
            )
        )
    if "compiled" in r and "lean_sac" in r:
        rows.append(
            (
                "... torch.compile'd before capture (learner.compile) vs the LeanRL-style SAC",
                f"{r['compiled']['updates_per_s']:.1f}",
                f"{r['lean_sac']['updates_per_s']:.1f}",
                _x(r["compiled"]["ratio_vs_lean_sac"]),
            )
        )
    if "ensemble" in r:
        e = r["ensemble"]
        rows.append(
            (
                f"... {c['algo']} with a {e['critics']}-critic ensemble (targets from 2) updates/s vs 2 critics",
                f"{e['updates_per_s']:.1f}",
                f"{e['two_critics_updates_per_s']:.1f}",
                _x(e["ratio_vs_two"]),
            )
        )
    return rows


def gpu_updates_rows(r: dict) -> list[Row]:
    return [row for name, case in r["cases"].items() for row in policy_updates_rows(case, name)]


def fleet_scaling_rows(r: dict) -> list[Row]:
    """Sims are paced to the learner (`algo.utd_ratio` 1): a fleet steps as fast as the learner updates."""
    rows = []
    raw_sac = r["baselines"]["sac_updates_per_s"]
    for run in r["runs"]:
        goal = "not reached" if run["time_to_goal_s"] is None else f"in {run['time_to_goal_s']:.0f} s"
        rows.append(
            (
                f"{run['robots']} sim robots: 90% success {goal} after {run['env_steps']:,} env steps; "
                "learner updates/s vs raw SAC",
                f"{run['updates_per_s']:.0f}",
                f"{raw_sac:.0f}",
                _x(run["updates_vs_raw_sac"]),
            )
        )
        rows.append(
            (
                f"... fleet env steps/s ({run['env_steps_per_s_per_robot']:.0f} per robot) vs raw sim + actor, "
                "one process",
                f"{run['env_steps_per_s_total']:.0f}",
                f"{r['baselines']['sim_actor_steps_per_s']:.0f}",
                _x(run["env_steps_per_s_total"] / r["baselines"]["sim_actor_steps_per_s"]),
            )
        )
    return rows


def sample_efficiency_rows(r: dict) -> list[Row]:
    """Ours and SB3's SAC, same settings and env steps (returns <= 0 make no ratio: "-")."""
    seeds, steps = len(r["config"]["seeds"]), r["config"]["steps"]
    rows = []
    for env_id, env in r["envs"].items():
        rows.append(
            (
                f"SAC on {env_id}: mean return at {steps:,} env steps ({seeds} seed{'s' if seeds > 1 else ''}) "
                "vs Stable-Baselines3 SAC, same settings",
                f"{env['final']['ours']:,.0f}",
                f"{env['final']['sb3']:,.0f}",
                _x(env["final"]["ratio"]),
            )
        )
        rows.append(
            (
                "... area under its learning curve (mean return per env step)",
                f"{env['auc']['ours']:,.0f}",
                f"{env['auc']['sb3']:,.0f}",
                _x(env["auc"]["ratio"]),
            )
        )
    return rows


BENCHMARKS: dict[str, Benchmark] = {
    "transport": Benchmark("transport.py", ["--transitions", "20000", "--repeats", "3"], transport_rows),
    "weight_sync": Benchmark("weight_sync.py", ["--params", "100e6", "--edges", "8"], weight_sync_rows),
    "buffer_insert": Benchmark("buffer_insert.py", [], buffer_insert_rows),
    "buffer_sample": Benchmark("buffer_sample.py", [], buffer_sample_rows),
    "buffer_growth": Benchmark(
        "buffer_growth.py", ["--sizes", "10000,100000,1000000", "--rounds", "10"], buffer_growth_rows
    ),
    "link_encryption": Benchmark(
        "link_encryption.py", [], link_encryption_rows, quick=["--seconds", "0.5", "--repeats", "1"]
    ),
    "policy_updates": Benchmark(
        "policy_updates.py",
        ["configs/reach_pixels.yaml"],
        policy_updates_rows,
        quick=["configs/reach_pixels.yaml", "--quick"],
    ),
    "critic_ensemble": Benchmark(
        "policy_updates.py",
        ["configs/reach.yaml", "policy.hidden=[256,256]", "--batch", "256", "--critics", "10"],
        policy_updates_rows,
        quick=["configs/reach.yaml", "policy.hidden=[256,256]", "--critics", "10", "--quick"],
    ),
    "fleet_scaling": Benchmark(
        "fleet_scaling.py",
        ["--robots", "1", "2", "4", "8", "--rate-robots", "0", "--max-wall-s", "300"],
        fleet_scaling_rows,
        quick=["--robots", "1", "--rate-robots", "0", "--max-wall-s", "60"],
    ),
    "gpu_updates": Benchmark("gpu_updates.py", [], gpu_updates_rows, gpu=True),
    "sample_efficiency": Benchmark("sample_efficiency.py", [], sample_efficiency_rows, long=True),
}


def run_one(name: str, bench: Benchmark, results: Path, quick: bool) -> tuple[list[Row], float, str | None]:
    """(rows, seconds, why it failed) of one benchmark run."""
    out = results / f"{name}.json"
    command = [sys.executable, str(BENCH / bench.script), *(bench.quick if quick else bench.args), "--out", str(out)]
    started = time.monotonic()
    log = results / f"{name}.log"
    with open(log, "w") as stream:
        done = subprocess.run(
            command,
            cwd=REPO,
            stdout=stream,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")},
        )
    seconds = time.monotonic() - started
    if done.returncode != 0 or not out.is_file():
        return [], seconds, f"exit {done.returncode}: see {log.relative_to(REPO) if log.is_relative_to(REPO) else log}"
    try:
        return bench.rows(json.loads(out.read_text())), seconds, None
    except (KeyError, TypeError, ValueError) as exc:
        return [], seconds, f"its results could not be read: {exc!r}"


def table(outcomes: dict[str, tuple[list[Row], float, str | None]], quick: bool) -> str:
    lines = [
        f"# Benchmarks ({'smoke-test sizes' if quick else 'full'}; {os.cpu_count()} cores; "
        f"{time.strftime('%Y-%m-%d %H:%M')})",
        "",
        "| benchmark | figure | ours | baseline | ratio |",
        "|---|---|---|---|---|",
    ]
    for name, (rows, _seconds, failed) in outcomes.items():
        if failed:
            lines.append(f"| {name} | FAILED ({failed}) | - | - | - |")
        for figure, ours, baseline, ratio in rows:
            lines.append(f"| {name} | {figure} | {ours} | {baseline} | {ratio} |")
    if any(seconds for _, seconds, _ in outcomes.values()):
        lines += [
            "",
            "Seconds each: "
            + ", ".join(f"{name} {seconds:.0f}" for name, (_, seconds, _) in outcomes.items() if seconds),
        ]  # 0: rows from an earlier run's JSON
    return "\n".join(lines) + "\n"


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="these benchmarks only")
    parser.add_argument("--quick", action="store_true", help="each at its smoke-test size")
    parser.add_argument("--results", type=Path, default=BENCH / "results", help="where the JSON and the table go")
    parser.add_argument("--table-only", action="store_true", help="rebuild RESULTS.md from the JSON already there")
    args = parser.parse_args()
    args.results.mkdir(parents=True, exist_ok=True)
    names = args.only or list(BENCHMARKS)
    outcomes = {}
    started = time.monotonic()
    kept = [] if args.only or args.quick else [n for n in names if BENCHMARKS[n].long]
    if any(BENCHMARKS[n].gpu for n in names) and not cuda_available():
        gpu = [n for n in names if BENCHMARKS[n].gpu]
        print(f"no CUDA GPU here: {', '.join(gpu)} not run; the table shows the rows of its last run", flush=True)
        kept += gpu
    names = [n for n in names if n not in kept]
    if args.table_only:
        for name in names:
            out = args.results / f"{name}.json"
            outcomes[name] = (
                (BENCHMARKS[name].rows(json.loads(out.read_text())), 0.0, None)
                if out.is_file()
                else ([], 0.0, f"no {out.name}")
            )
    for index, name in enumerate([] if args.table_only else names, 1):
        print(f"[{time.monotonic() - started:5.0f}s] {index}/{len(names)} {name} ...", flush=True)
        outcomes[name] = run_one(name, BENCHMARKS[name], args.results, args.quick)
        rows, seconds, failed = outcomes[name]
        print(
            f"[{time.monotonic() - started:5.0f}s] {name}: {failed or f'{len(rows)} figures'} in {seconds:.0f} s",
            flush=True,
        )
    for name in kept:  # not run: the rows of its last run, if any
        out = args.results / f"{name}.json"
        if out.is_file():
            outcomes[name] = (BENCHMARKS[name].rows(json.loads(out.read_text())), 0.0, None)
    text = table(outcomes, args.quick)
    (args.results / "RESULTS.md").write_text(text)
    print()
    print(text)
    return 1 if any(failed for _, _, failed in outcomes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
