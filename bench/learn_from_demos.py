"""How well a chunk policy learns a reach variant offline from the scripted expert's demonstrations:
success per instruction (two-colour reach) or overall, every `--eval-every` updates.

Not a speed benchmark: it answers "can this policy learn this task from clean demonstrations, and
in how many updates?" without the fleet, so an online run that does not learn can be told apart
from a policy that cannot. Episodes are collected with the expert alone (`ReachRobot.expert_action`);
every step's target is the next H executed actions, the last one repeated past the episode's end
(as the buffer's chunk sampler gives them, though here the repeats are weighted like the rest, where
a run's `chunk_mask` gives them weight 0); `algo.update` of behaviour cloning trains on them.

    python bench/learn_from_demos.py --policy vla --obs-mode image --targets two_colours --lr 1e-3
    python bench/learn_from_demos.py --policy flow --obs-mode state --targets table
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from user_rl.algos import BCSettings, make_algo  # noqa: E402
from user_rl.evaluation import evaluate  # noqa: E402
from user_rl.hal.registry import make_robot  # noqa: E402
from user_rl.sim.reach import ReachRobot  # noqa: E402


def demonstrations(robot: ReachRobot, episodes: int, chunk: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every step of `episodes` expert episodes: its observation and the next `chunk` actions."""
    observations: dict[str, list] = {key: [] for key in robot.observation_space.spaces}
    chunks = []
    for _ in range(episodes):
        obs, seen, actions = robot.reset(), [], []
        while True:
            action = robot.expert_action()
            seen.append(obs)
            actions.append(action)
            result = robot.step(action)
            obs = result.observation
            if result.terminated or result.truncated:
                break
        actions = np.asarray(actions, np.float32)
        for t, step_obs in enumerate(seen):
            chunks.append(actions[np.minimum(np.arange(t, t + chunk), len(actions) - 1)])
            for key, value in step_obs.items():
                observations[key].append(value)
    return {key: np.asarray(values) for key, values in observations.items()}, np.asarray(chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="vla", choices=["vla", "flow"])
    parser.add_argument("--obs-mode", default="image", choices=["image", "state"])
    parser.add_argument("--targets", default="two_colours", choices=["two_colours", "table"])
    parser.add_argument("--episodes", type=int, default=400, help="demonstrated episodes")
    parser.add_argument("--updates", type=int, default=4000)
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--eval-episodes", type=int, default=20, help="per instruction")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--chunk", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results/learn_from_demos.json"))
    args = parser.parse_args()

    torch.manual_seed(0)
    options = dict(
        obs_mode=args.obs_mode,
        image_size=32,
        camera="top",
        targets=args.targets,
        success_distance=0.05,
        episode_steps=30,
    )
    teacher = make_robot("mujoco_reach", robot_id="expert", seed=0, **options)
    started = time.perf_counter()
    obs, chunks = demonstrations(teacher, args.episodes, args.chunk)
    print(f"{args.episodes} demonstrated episodes ({len(chunks):,} steps) in {time.perf_counter() - started:.0f} s")

    policy_options = {
        "chunk": args.chunk,
        "flow_steps": 5,
        **({"size": "tiny"} if args.policy == "vla" else {"hidden": [256, 256]}),
    }
    algo = make_algo(
        "bc", teacher.observation_space, teacher.action_space, args.policy, policy_options, BCSettings(actor_lr=args.lr)
    )
    goals = ("red", "green") if args.targets == "two_colours" else ("random",)
    judges = {
        goal: make_robot(
            "mujoco_reach", robot_id=f"judge-{goal}", seed=7, **({"goal": goal} if goal != "random" else {}), **options
        )
        for goal in goals
    }
    rng = np.random.default_rng(0)
    all_acted = torch.ones(args.batch, args.chunk)
    curve = []
    started = time.perf_counter()
    for update in range(1, args.updates + 1):
        rows = rng.integers(0, len(chunks), args.batch)
        metrics = algo.update(
            {
                "obs": {key: torch.from_numpy(value[rows]) for key, value in obs.items()},
                "action_chunk": torch.from_numpy(chunks[rows]),
                "chunk_intervened": all_acted,
                "chunk_policy_acted": torch.zeros_like(all_acted),
            }
        )
        if update % args.eval_every == 0 or update == args.updates:
            success = {
                goal: evaluate(judge, algo.actor, args.eval_episodes, seed=5).success_rate
                for goal, judge in judges.items()
            }
            algo.actor.train()
            curve.append(
                {
                    "updates": update,
                    "seconds": round(time.perf_counter() - started, 1),
                    "loss": round(float(metrics["bc_loss"]), 4),
                    "success": success,
                }
            )
            print(json.dumps(curve[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"config": {k: str(v) for k, v in vars(args).items()}, "steps": len(chunks), "curve": curve}, indent=2
        )
    )


if __name__ == "__main__":
    main()
