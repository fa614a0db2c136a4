"""Time to 90% reach success with 1, 2 and 4 sim robots, with rates as ratios to raw baselines.

Baselines, measured in the same run on the same machine:
- raw sim:   `ReachRobot.step` with random actions in one process (no policy, no network);
- raw actor: the same plus local actor inference (what an edge does, minus the link);
- raw SAC:   `SAC.update` on an in-memory batch in one process (what the learner does, minus
             ingest, sampling and publishing).

    python bench/fleet_scaling.py [--robots 1 2 4] [--goal 0.9] [--out bench/results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from user_rl.algos import SAC  # noqa: E402
from user_rl.config import load_config  # noqa: E402
from user_rl.hal.registry import make_robot  # noqa: E402
from user_rl.launch import train  # noqa: E402
from user_rl.policies import make_actor  # noqa: E402


def raw_sim_rate(cfg, with_actor: bool, seconds: float = 3.0) -> float:
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
    robot.close()
    return steps / (time.perf_counter() - start)


def raw_update_rate(cfg, seconds: float = 5.0) -> float:
    torch.set_num_threads(1)
    robot = make_robot(cfg.robot.type, **cfg.robot_options(0))
    sac = SAC(robot.observation_space, robot.action_space, cfg.policy.type, {"hidden": cfg.policy.hidden})
    b = cfg.algo.batch_size
    obs = {k: torch.as_tensor(np.stack([s.sample() for _ in range(b)])) for k, s in robot.observation_space.spaces.items()}
    batch = {"obs": obs, "next_obs": obs, "action": torch.rand(b, *robot.action_space.shape) * 2 - 1,
             "reward": torch.randn(b), "terminated": torch.zeros(b)}
    for _ in range(10):
        sac.update(batch)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sac.update(batch)
        n += 1
    robot.close()
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/reach.yaml")
    parser.add_argument("--robots", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--goal", type=float, default=0.9)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    base = load_config(args.config)
    sim = raw_sim_rate(base, with_actor=False)
    sim_actor = raw_sim_rate(base, with_actor=True)
    updates = raw_update_rate(base)
    print(f"raw baselines: sim {sim:.0f} steps/s, sim+actor {sim_actor:.0f} steps/s, SAC {updates:.0f} updates/s")

    rows = []
    for n in args.robots:
        with tempfile.TemporaryDirectory() as root:
            cfg = load_config(args.config, [
                f"fleet.num_robots={n}", f"stop.success_rate={args.goal}", "stop.eval_episodes=20",
                "stop.eval_every_s=10", f"run_root={root}",
            ])
            summary = train(cfg, out=lambda line: None)
        learner = summary["learner"]
        train_s = max(summary["wall_s"], 1e-9)
        total_rate = learner["env_steps"] / train_s
        update_rate = learner["updates"] / train_s
        row = {
            "robots": n,
            "stop_reason": summary["stop_reason"],
            "time_to_goal_s": summary["goal_reached_s"],
            "env_steps": learner["env_steps"],
            "env_steps_per_s_total": round(total_rate, 1),
            "env_steps_per_s_per_robot": round(total_rate / n, 1),
            "updates_per_s": round(update_rate, 1),
            "per_robot_vs_raw_sim_actor": round(total_rate / n / sim_actor, 4),
            "updates_vs_raw_sac": round(update_rate / updates, 3),
        }
        rows.append(row)
        print(json.dumps(row))

    print()
    print("| robots | time to {:.0%} (s) | env steps | steps/s total | steps/s per robot | updates/s | updates vs raw SAC |".format(args.goal))
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['robots']} | {r['time_to_goal_s']} | {r['env_steps']:,} | {r['env_steps_per_s_total']} | "
              f"{r['env_steps_per_s_per_robot']} | {r['updates_per_s']} | {r['updates_vs_raw_sac']} |")
    result = {"baselines": {"sim_steps_per_s": sim, "sim_actor_steps_per_s": sim_actor, "sac_updates_per_s": updates},
              "runs": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
