"""Time to 90% reach success with 1, 2 and 4 sim robots, and the learner's update rate with the
fleet streaming, each as a ratio to a raw baseline measured in the same run on the same machine.

Baselines:
- raw sim:   `ReachRobot.step` with random actions in one process (no policy, no network);
- raw actor: the same plus local actor inference (what an edge does, minus the link);
- raw SAC:   `SAC.update` on one in-memory batch of the config's batch size, in one thread, with
             the torch thread count the learner itself uses (`learner.torch_threads`, else the
             cores the edges leave free: 1 on a 2-core machine with 4 sims). That is the fair
             ceiling: the learner's trainer process runs the same optimiser step on the same
             threads, and everything the learner does besides (ingest, acks, sampling,
             publishing, checkpoints) runs in the learner's own process beside it. The baseline is
             measured on an idle fleet before and after the streaming run, each time in a
             fresh process with no fleet running; the ratio is against the faster of the two. On a
             shared machine the other users' load moves both numbers: the 1-minute load average is reported with them.
- raw SAC beside sims: the same plain loop, measured while `--rate-robots` processes step the
             sim with the actor at the per-robot rate the fleet had in the streaming run. On 2
             cores 4 sims take CPU from any learner, however it is built; this baseline keeps
             that share and leaves out only what is the learner's own (ingest, storage,
             sampling, acks, publishing), so its ratio is the learner's overhead.

- raw SAC interleaved (`--interleave N`): on a shared host the plain loop alone drifts by 10-20%
             within minutes, more than the gap being measured. This mode alternates, N times, a
             `--window`-second streaming window (the learner's updates/s from its status) with a
             quiet one: the learner is paused, the paced fleet runs out of credit within a batch,
             and the plain loop runs in a fresh process. Each cycle's ratio compares adjacent
             windows; the median over the cycles is reported.

The learner's rate is read from the run's metrics.jsonl over a window while the fleet streams:
after the first update (learning_starts reached) plus `--warmup` seconds, excluding every
interval that holds an evaluation (the learner is paused then). The rate run sets no goal, so
nothing pauses it; the goal runs report the same windowed rate.

    python bench/fleet_scaling.py [--robots 1 2 4 8] [--rate-robots 4] [--rate-seconds 120] [--max-wall-s 300]
                                  [--out bench/results.json]
    python bench/fleet_scaling.py --robots        # the update-rate run only
    python bench/fleet_scaling.py --robots --interleave 6   # the update-rate run, baseline interleaved
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from user_rl.algos import SAC  # noqa: E402
from user_rl.cloud.learner import learner_torch_threads  # noqa: E402
from user_rl.config import load_config  # noqa: E402
from user_rl.hal.registry import make_robot  # noqa: E402
from user_rl.launch import train  # noqa: E402
from user_rl.policies import make_actor  # noqa: E402


def raw_sim_rate(cfg, with_actor: bool, seconds: float = 3.0, pace_hz: float = 0.0) -> float:
    """Sim steps/s (random actions, or the actor's); `pace_hz` caps the rate like a paced edge."""
    torch.set_num_threads(1)
    robot = make_robot(cfg.robot.type, **cfg.robot_options(0))
    actor = make_actor(cfg.policy.type, robot.observation_space, robot.action_space, hidden=cfg.policy.hidden)
    obs, steps, start = robot.reset(seed=0), 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        if with_actor:
            action = actor.act({k: torch.as_tensor(v)[None] for k, v in obs.items()})[0].numpy()
        else:
            action = robot.action_space.sample()
        result = robot.step(action)
        obs = robot.reset() if result.truncated or result.terminated else result.observation
        steps += 1
        if pace_hz:
            time.sleep(max(0.0, start + steps / pace_hz - time.perf_counter()))
    robot.close()
    return steps / (time.perf_counter() - start)


def raw_update_rate(cfg, seconds: float = 5.0) -> float:
    """Plain `SAC.update` steps per second on the learner's torch thread count."""
    torch.set_num_threads(learner_torch_threads(cfg))
    robot = make_robot(cfg.robot.type, **cfg.robot_options(0))
    sac = SAC(robot.observation_space, robot.action_space, cfg.policy.type, {"hidden": cfg.policy.hidden})
    b = cfg.algo.batch_size
    obs = {
        k: torch.as_tensor(np.stack([s.sample() for _ in range(b)])) for k, s in robot.observation_space.spaces.items()
    }
    batch = {
        "obs": obs,
        "next_obs": obs,
        "action": torch.rand(b, *robot.action_space.shape) * 2 - 1,
        "reward": torch.randn(b),
        "terminated": torch.zeros(b),
    }
    for _ in range(10):
        sac.update(batch)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sac.update(batch)
        n += 1
    robot.close()
    return n / (time.perf_counter() - start)


def windowed_update_rate(metrics_path: Path, warmup_s: float) -> dict:
    """Updates/s while training: progress records from `warmup_s` after the first update, over the
    intervals that hold no evaluation (an evaluation pauses the learner)."""
    records = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    started = next((r["time_s"] for r in records if "eval" not in r and r["updates"] > 0), None)
    if started is None:
        return {"updates_per_s": 0.0, "window_s": 0.0, "updates": 0}
    updates = seconds = steps = 0.0
    previous = None
    for record in records:
        if "eval" in record:
            previous = None  # the interval around an evaluation does not count
            continue
        if record["time_s"] < started + warmup_s:
            continue
        if previous is not None:
            updates += record["updates"] - previous["updates"]
            steps += record["env_steps"] - previous["env_steps"]
            seconds += record["time_s"] - previous["time_s"]
        previous = record
    return {
        "updates_per_s": round(updates / max(seconds, 1e-9), 1),
        "window_s": round(seconds, 1),
        "updates": int(updates),
        "env_steps_per_s": round(steps / max(seconds, 1e-9), 1),
    }


def run_fleet(config: str, overrides: list[str], root: str) -> dict:
    cfg = load_config(config, [*overrides, f"run_root={root}"])
    summary = train(cfg, out=lambda line: None)
    return summary


def raw_update_rate_apart(args, seconds: float = 8.0) -> float:
    """`raw_update_rate` in a fresh process (no Ray driver threads, torch state of its own)."""
    cmd = [
        sys.executable,
        __file__,
        "--config",
        args.config,
        "--rate-robots",
        str(args.rate_robots),
        "--raw-sac-only",
        str(seconds),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def raw_update_rate_beside_sims(args, sims: int, steps_per_s: float, seconds: float = 12.0) -> float:
    """`raw_update_rate` while `sims` processes step the sim with its actor at the rate each robot
    had in the fleet run: the plain loop on a machine exactly as busy with simulation as the
    learner's was, minus everything that is the learner's own (ingest, storage, sampling, acks)."""
    cmd = [sys.executable, __file__, "--config", args.config, "--sim-load", str(steps_per_s), str(seconds + 4)]
    load = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL) for _ in range(sims)]
    try:
        time.sleep(2.0)  # the sims are up and stepping
        return raw_update_rate_apart(args, seconds)
    finally:
        for process in load:
            process.wait(timeout=60)


def rate_run_overrides(args, wall_s: float) -> list[str]:
    """An update-rate run's fleet: `--rate-robots` streaming for `wall_s`, never stopped by success or steps."""
    return [
        f"fleet.num_robots={args.rate_robots}",
        "stop.success_rate=null",
        f"stop.max_wall_s={wall_s}",
        "stop.max_env_steps=10000000",
    ]


def update_rate_run(args, base) -> dict:
    """The learner's updates/s with `--rate-robots` streaming (no goal: nothing pauses it)."""
    before = raw_update_rate_apart(args)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as root:
        summary = run_fleet(args.config, rate_run_overrides(args, args.rate_seconds), root)
        window = windowed_update_rate(Path(summary["run_dir"]) / "metrics.jsonl", args.warmup)
    load_during = os.getloadavg()[0]
    after = raw_update_rate_apart(args)
    raw = max(before, after)
    per_robot = (window.get("env_steps_per_s") or 0.0) / args.rate_robots
    beside = raw_update_rate_beside_sims(args, args.rate_robots, per_robot) if per_robot else 0.0
    row = {
        "robots": args.rate_robots,
        "torch_threads": learner_torch_threads(base),
        "raw_sac_updates_per_s_before": round(before, 1),
        "raw_sac_updates_per_s_after": round(after, 1),
        "learner_updates_per_s": window["updates_per_s"],
        "window_s": window["window_s"],
        "fleet_env_steps_per_s": window.get("env_steps_per_s"),
        "trainer_waits_s": summary["learner"].get("update_waits_s"),
        "learner_vs_raw_sac": round(window["updates_per_s"] / raw, 3),
        "raw_sac_beside_sims_updates_per_s": round(beside, 1),
        "learner_vs_raw_sac_beside_sims": round(window["updates_per_s"] / beside, 3) if beside else None,
        "loadavg_1min_before": round(load_before, 2),
        "loadavg_1min_after": round(load_during, 2),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(row))
    return row


def interleaved_rate_run(args) -> dict:
    """The learner's updates/s in streaming windows, each against the plain loop in the quiet
    window right after it (the learner paused, the paced fleet idle)."""
    import ray

    from user_rl.launch.training import learner_actor_name

    cycle_s = args.window + 5.0 + 8.0  # streaming window, settling after a resume, plain loop with its start
    wall = args.warmup + 60.0 + args.interleave * cycle_s
    run_dir: list[str] = []
    outcome: dict = {}

    def note_run_dir(line: str) -> None:
        if line.startswith("run directory: "):
            run_dir.append(line.removeprefix("run directory: "))

    with tempfile.TemporaryDirectory() as root:
        cfg = load_config(args.config, [*rate_run_overrides(args, wall), f"run_root={root}"])
        fleet = threading.Thread(target=lambda: outcome.update(summary=train(cfg, out=note_run_dir)), daemon=True)
        fleet.start()
        learner = None
        while learner is None:
            try:
                learner = ray.get_actor(learner_actor_name(Path(run_dir[0]))) if run_dir else None
            except ValueError:  # not placed yet
                pass
            time.sleep(0.5)
        while ray.get(learner.status.remote())["updates"] == 0:  # learning_starts not reached yet
            time.sleep(0.5)
        time.sleep(args.warmup)
        cycles = []
        for _ in range(args.interleave):
            start, first = time.monotonic(), ray.get(learner.status.remote())["updates"]
            time.sleep(args.window)
            end, last = time.monotonic(), ray.get(learner.status.remote())["updates"]
            ray.get(learner.pause.remote())
            time.sleep(1.0)  # the paced edges use up their credit and wait
            raw = raw_update_rate_apart(args, seconds=5.0)
            ray.get(learner.resume.remote())
            time.sleep(5.0)  # the fleet is granted steps again and the trainer's slots refill
            rate = (last - first) / (end - start)
            cycles.append(
                {
                    "learner_updates_per_s": round(rate, 1),
                    "raw_sac_updates_per_s": round(raw, 1),
                    "ratio": round(rate / raw, 3),
                }
            )
            print(json.dumps(cycles[-1]), flush=True)
        fleet.join()
    ratios = [c["ratio"] for c in cycles]
    row = {
        "robots": args.rate_robots,
        "cycles": cycles,
        "median_ratio": round(statistics.median(ratios), 3),
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
        "window_s": args.window,
        "cpus": os.cpu_count(),
    }
    print(
        f"\nlearner with {args.rate_robots} robots streaming, against the plain loop in the quiet window right "
        f"after each of {len(cycles)} {args.window:.0f}-s windows: median {row['median_ratio']}x "
        f"(min {row['min_ratio']}, max {row['max_ratio']})"
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/reach.yaml")
    parser.add_argument("--robots", type=int, nargs="*", default=[1, 2, 4], help="time-to-goal runs")
    parser.add_argument("--goal", type=float, default=0.9)
    parser.add_argument("--rate-robots", type=int, default=4, help="robots streaming in the update-rate run (0: none)")
    parser.add_argument("--rate-seconds", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after the first update before the window")
    parser.add_argument(
        "--interleave",
        type=int,
        default=0,
        help="update-rate run with the plain loop measured between N streaming windows",
    )
    parser.add_argument("--window", type=float, default=15.0, help="seconds per streaming window (--interleave)")
    parser.add_argument(
        "--max-wall-s",
        type=float,
        default=None,
        help="each time-to-goal run stops here if the goal is not reached (default: the config's)",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--raw-sac-only", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--sim-load", type=float, nargs=2, default=None, help=argparse.SUPPRESS)  # steps/s, seconds
    args = parser.parse_args()
    if args.sim_load:
        rate, seconds = args.sim_load
        raw_sim_rate(load_config(args.config, []), with_actor=True, seconds=seconds, pace_hz=rate)
        return
    if args.raw_sac_only:
        print(
            raw_update_rate(load_config(args.config, [f"fleet.num_robots={args.rate_robots or 4}"]), args.raw_sac_only)
        )
        return

    base = load_config(args.config, [f"fleet.num_robots={args.rate_robots or 4}"])
    result: dict = {}
    if args.rate_robots and args.interleave:
        result["update_rate_interleaved"] = interleaved_rate_run(args)
    elif args.rate_robots:
        result["update_rate"] = update_rate_run(args, base)
    sim = raw_sim_rate(base, with_actor=False)
    sim_actor = raw_sim_rate(base, with_actor=True)
    updates = raw_update_rate(base)
    print(
        f"raw baselines: sim {sim:.0f} steps/s, sim+actor {sim_actor:.0f} steps/s, SAC {updates:.0f} updates/s "
        f"({learner_torch_threads(base)} torch threads)"
    )
    result["baselines"] = {"sim_steps_per_s": sim, "sim_actor_steps_per_s": sim_actor, "sac_updates_per_s": updates}

    rows = []
    for n in args.robots:
        with tempfile.TemporaryDirectory() as root:
            limit = [f"stop.max_wall_s={args.max_wall_s}"] if args.max_wall_s else []
            summary = run_fleet(
                args.config,
                [
                    f"fleet.num_robots={n}",
                    f"stop.success_rate={args.goal}",
                    "stop.eval_episodes=20",
                    "stop.eval_every_s=10",
                    *limit,
                ],
                root,
            )
            window = windowed_update_rate(Path(summary["run_dir"]) / "metrics.jsonl", args.warmup)
        learner = summary["learner"]
        train_s = max(summary["wall_s"], 1e-9)
        total_rate = learner["env_steps"] / train_s
        row = {
            "robots": n,
            "stop_reason": summary["stop_reason"],
            "time_to_goal_s": summary["goal_reached_s"],
            "env_steps": learner["env_steps"],
            "env_steps_per_s_total": round(total_rate, 1),
            "env_steps_per_s_per_robot": round(total_rate / n, 1),
            "updates_per_s": window["updates_per_s"],
            "per_robot_vs_raw_sim_actor": round(total_rate / n / sim_actor, 4),
            "updates_vs_raw_sac": round(window["updates_per_s"] / updates, 3),
        }
        rows.append(row)
        print(json.dumps(row))

    if rows:
        print()
        print(
            f"| robots | time to {args.goal:.0%} (s) | env steps | steps/s total | steps/s per robot | updates/s "
            "| updates vs raw SAC |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['robots']} | {r['time_to_goal_s']} | {r['env_steps']:,} | {r['env_steps_per_s_total']} | "
                f"{r['env_steps_per_s_per_robot']} | {r['updates_per_s']} | {r['updates_vs_raw_sac']} |"
            )
    if "update_rate" in result:
        r = result["update_rate"]
        print(
            f"\nlearner with {r['robots']} robots streaming: {r['learner_updates_per_s']} updates/s over "
            f"{r['window_s']} s = {r['learner_vs_raw_sac']}x raw SAC on an idle machine "
            f"({r['raw_sac_updates_per_s_before']} / "
            f"{r['raw_sac_updates_per_s_after']} updates/s before / after, {r['torch_threads']} torch threads; "
            f"load {r['loadavg_1min_before']} -> {r['loadavg_1min_after']} on {r['cpus']} cores); "
            f"{r['learner_vs_raw_sac_beside_sims']}x raw SAC beside {r['robots']} sims stepping at the fleet's rate "
            f"({r['raw_sac_beside_sims_updates_per_s']} updates/s)"
        )
    result["runs"] = rows
    write_result(args.out, result)


if __name__ == "__main__":
    main()
