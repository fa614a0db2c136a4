"""Sample efficiency: SAC in this system against Stable-Baselines3's SAC, same settings, same env steps.

Each (env, seed) is trained twice, to the same number of env steps:
- ours: `user-rl train` with the env as a gym robot (user_rl/sim/gym_adapter.py): one sim robot paced
  to the learner (`fleet.pace_to_learner`, `algo.utd_ratio` 1), the learner in its own processes, every
  transition through the edge, ZeroMQ, the durable buffer and back as published weights;
- baseline: `stable_baselines3.SAC` in one process (`train_freq` 1, `gradient_steps` 1).

Both are evaluated at every `--eval-every` env steps and at `--steps`, on a separate eval env, with
`--eval-episodes` deterministic episodes (the mean of the Gaussian, squashed), seeded alike (the episode
seeds `user_rl.evaluation` uses). Ours comes from the run's own evaluations: `stop.eval_every_env_steps`
holds the paced fleet at each point until the learner has made exactly the updates those steps earn
(`ceil(utd_ratio * (steps - learning_starts))`, as a serial loop), then evaluates that snapshot. SB3 is
evaluated where its loop stands at the same point: after the update of that step, before the next step.
The JSON records the updates behind every point of both, so the match can be checked.

Matched: networks (256, 256) ReLU for actor and both critics, batch 256, Adam lr 3e-4 (actor, critics,
temperature), gamma 0.99, tau 0.005 every update, one update per env step after `learning_starts`
(uniform random actions before), replay of everything, temperature learned from 1.0 (SB3's
`ent_coef="auto"`; our `algo.init_alpha` 1.0, the default is 0.1) towards SB3's target entropy -|A|
(`algo.target_entropy_scale` 1), time-limit truncation bootstraps in both, no observation or reward
normalisation, one torch thread each.

Not matched exactly:
- Our learner is asynchronous: its updates run beside the env steps, paced by step credit, so between
  two evaluation points the learner may be up to a batch of steps (`fleet.batch_transitions`) ahead of or
  behind one update per step; at each point the count is exact. SB3 is strictly step, update, step.
- Our edge acts with the newest published actor (`learner.publish_every_updates` here 1, plus the
  time it takes to arrive); SB3 acts with the current one. The warm-up likewise ends when the first
  actor arrives, a few steps after `learning_starts` (SB3: exactly there).
- SB3's log-std is clipped to [-20, 2]; ours is squashed smoothly into [-5, 2].
- Update order inside one step: SB3 steps the temperature first and the actor with actions sampled before
  the critic step; ours steps critics, actor, then temperature. SB3's critic loss is half ours (the same
  direction; Adam makes the scale nearly irrelevant).
- Episodes of the eval env start from the same seeds, but the policies differ, so do their episodes.

Why run_all.py runs it only with --quick: at full size this is 9 runs x 2 systems x 45k updates. The
quick runs on the 2-core box (busy: load average 5-8) took 0.05-0.07 s per update for ours (start-up
and evaluations included) and 0.03-0.04 s for SB3, which makes 10-12 hours in all; on an idle 2-core
box (80 updates/s, bench/fleet_scaling.py) about 3-4 hours; `--jobs 2` on 4 or more cores halves it. That is far
over run_all's 30-minute budget: a full run_all leaves it out (and keeps the rows of
bench/results/sample_efficiency.json if there is one); `run_all.py --only sample_efficiency` or this script runs it.

Needs Stable-Baselines3, which user-rl itself does not: `pip install -e ".[bench]"` (or `pip install
stable-baselines3`; 2.x needs only gymnasium, numpy, torch and cloudpickle, all already here, and
leaves torch as it is). The dev extra includes it.

    python bench/sample_efficiency.py                    # 3 envs x 3 seeds, 50k steps (hours)
    python bench/sample_efficiency.py --quick            # HalfCheetah, 1 seed, 3k steps: a smoke check
    python bench/sample_efficiency.py --envs Hopper-v5 --seeds 0 1 --jobs 2
    python bench/sample_efficiency.py --runs-dir runs/se --jobs 2   # stop it any time; the same line resumes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import yaml  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import checkout_env  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ENVS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")
SB3_MISSING = (
    "Stable-Baselines3 is needed for the baseline and is not a dependency of user-rl: "
    'pip install -e ".[bench]" (or pip install stable-baselines3)'
)
# The settings both systems get (our_config and sb3_kwargs spell them each system's way).
MATCHED = {
    "hidden": [256, 256],
    "batch_size": 256,
    "learning_rate": 3e-4,
    "gamma": 0.99,
    "tau": 0.005,
    "updates_per_env_step": 1,
    "init_temperature": 1.0,
    "target_entropy": "-|A|",
}


@dataclass
class Schedule:
    steps: int
    eval_every: int
    eval_episodes: int
    learning_starts: int

    def points(self) -> list[int]:
        """The env steps of the evaluations: each multiple of eval_every, and the last step."""
        return sorted({*range(self.eval_every, self.steps + 1, self.eval_every), self.steps})


def eval_seed(seed: int, round_index: int) -> int:
    """The `evaluate(seed=...)` of an evaluation round of a run with `seed` (as user_rl/launch/training.py)."""
    return 1000 * seed + 100 + round_index


# -- ours ------------------------------------------------------------------------------------------
def our_config(env_id: str, seed: int, schedule: Schedule, run_root: Path) -> dict:
    """The `user-rl train` config with the matched settings."""
    return {
        "name": f"sample-efficiency-{env_id}-s{seed}",
        "seed": seed,
        "run_root": str(run_root),
        "robot": {"type": "gym", "options": {"env_id": env_id}},
        "fleet": {"num_robots": 1, "pace_to_learner": True, "batch_transitions": 16},
        "policy": {"type": "mlp", "hidden": MATCHED["hidden"]},
        "algo": {
            "type": "sac",
            "gamma": MATCHED["gamma"],
            "tau": MATCHED["tau"],
            "actor_lr": MATCHED["learning_rate"],
            "critic_lr": MATCHED["learning_rate"],
            "batch_size": MATCHED["batch_size"],
            "learning_starts": schedule.learning_starts,
            "utd_ratio": MATCHED["updates_per_env_step"],
            "init_alpha": MATCHED["init_temperature"],
            "target_entropy_scale": 1.0,
        },
        "learner": {"torch_threads": 1, "publish_every_updates": 1, "tensorboard_every_s": 0},
        "stop": {
            "max_env_steps": schedule.steps,
            "max_wall_s": 7 * 24 * 3600.0,
            "eval_every_s": None,
            "eval_every_env_steps": schedule.eval_every,
            "eval_episodes": schedule.eval_episodes,
        },
    }


def run_ours(env_id: str, seed: int, schedule: Schedule, root: Path) -> dict:
    """One `user-rl train` run in its own process; its evaluations are the curve."""
    run_root = root / f"ours-{env_id}-s{seed}"
    shutil.rmtree(run_root, ignore_errors=True)  # an unfinished run starts again
    run_root.mkdir(parents=True)
    config = run_root / "config.yaml"
    config.write_text(yaml.safe_dump(our_config(env_id, seed, schedule, run_root), sort_keys=False))
    started = time.monotonic()
    with open(run_root / "train.log", "w") as log:
        # run in the run's directory: MuJoCo writes its MUJOCO_LOG.TXT of warnings where it runs
        done = subprocess.run(
            [sys.executable, "-m", "user_rl.cli", "train", str(config)],
            cwd=run_root,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=checkout_env(),
        )
    wall = time.monotonic() - started
    summaries = list(run_root.glob("*/summary.json"))
    if done.returncode != 0 or not summaries:
        raise RuntimeError(
            f"ours {env_id} seed {seed}: user-rl train exited {done.returncode}; see {run_root / 'train.log'}"
        )
    summary = json.loads(summaries[0].read_text())
    points = [
        {"env_steps": e["env_steps"], "updates": e["updates"], "mean_return": e["mean_return"]}
        for e in summary["evaluations"]
    ]
    result = {"points": points, "wall_s": round(wall, 1), "stop_reason": summary["stop_reason"]}
    result_file(root, "ours", env_id, seed).write_text(json.dumps(result))
    return result


# -- Stable-Baselines3 ---------------------------------------------------------------------------
def sb3_kwargs(schedule: Schedule, seed: int) -> dict:
    """`stable_baselines3.SAC` keywords with the matched settings."""
    return {
        "learning_rate": MATCHED["learning_rate"],
        "buffer_size": schedule.steps,
        "learning_starts": schedule.learning_starts,
        "batch_size": MATCHED["batch_size"],
        "tau": MATCHED["tau"],
        "gamma": MATCHED["gamma"],
        "train_freq": 1,
        "gradient_steps": MATCHED["updates_per_env_step"],
        "ent_coef": f"auto_{MATCHED['init_temperature']}",
        "target_entropy": "auto",
        "target_update_interval": 1,
        "policy_kwargs": {"net_arch": MATCHED["hidden"]},
        "seed": seed,
        "device": "cpu",
        "verbose": 0,
    }


def play(predict, env, episodes: int, seed: int) -> float:
    """Mean return of deterministic episodes, each from the seed `user_rl.evaluation.evaluate` gives it."""
    from user_rl.evaluation import EVAL_SEED_BASE

    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED_BASE + seed * 10_000 + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(predict(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return sum(returns) / len(returns)


def run_sb3_here(env_id: str, seed: int, schedule: Schedule) -> dict:
    """Train SB3's SAC in this process, evaluating at the schedule's points."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    eval_env = gym.make(env_id)
    points: list[dict] = []

    def evaluate(model) -> None:
        mean = play(
            lambda obs: model.predict(obs, deterministic=True)[0],
            eval_env,
            schedule.eval_episodes,
            eval_seed(seed, len(points)),
        )
        points.append({"env_steps": model.num_timesteps, "updates": model._n_updates, "mean_return": mean})

    class EvalAtSteps(BaseCallback):
        """At the start of a rollout the previous step's update is done: the point is complete."""

        def _on_rollout_start(self) -> None:
            steps = self.model.num_timesteps
            if steps and steps % schedule.eval_every == 0 and steps < schedule.steps:
                evaluate(self.model)

        def _on_step(self) -> bool:
            return True

    started = time.monotonic()
    model = SAC("MlpPolicy", gym.make(env_id), **sb3_kwargs(schedule, seed))
    model.learn(total_timesteps=schedule.steps, callback=EvalAtSteps())
    evaluate(model)  # the last step's update is done once learn returns
    eval_env.close()
    return {"points": points, "wall_s": round(time.monotonic() - started, 1)}


def run_sb3(env_id: str, seed: int, schedule: Schedule, root: Path) -> dict:
    """`run_sb3_here` in a process of its own (runs side by side with --jobs)."""
    out = result_file(root, "sb3", env_id, seed)
    command = [
        sys.executable,
        __file__,
        "--sb3-run",
        env_id,
        str(seed),
        "--out",
        str(out),
        *(f"--{key.replace('_', '-')}={value}" for key, value in asdict(schedule).items()),
    ]
    with open(root / f"sb3-{env_id}-s{seed}.log", "w") as log:
        done = subprocess.run(command, cwd=root, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"sb3 {env_id} seed {seed}: exited {done.returncode}; see {log.name}")
    return json.loads(out.read_text())


# -- the comparison ------------------------------------------------------------------------------
def result_file(root: Path, system: str, env_id: str, seed: int) -> Path:
    """Where a finished run leaves its curve: a resumed comparison reads it back instead of running again."""
    return root / f"{system}-{env_id}-s{seed}.json"


def run_or_read(system: str, env_id: str, seed: int, schedule: Schedule, root: Path) -> dict:
    finished = result_file(root, system, env_id, seed)
    if finished.exists():
        return json.loads(finished.read_text())
    return {"ours": run_ours, "sb3": run_sb3}[system](env_id, seed, schedule, root)


def area(steps: list[int], returns: list[float]) -> float:
    """Area under the curve (trapezoids over the evaluation points), per env step."""
    pairs = list(zip(steps, returns))
    total = sum((s1 - s0) * (r0 + r1) / 2 for (s0, r0), (s1, r1) in zip(pairs, pairs[1:]))
    return total / (steps[-1] - steps[0]) if len(steps) > 1 else returns[0]


def ratio(ours: float, baseline: float) -> float | None:
    """ours / baseline; None where the baseline is not positive (a ratio of returns <= 0 means nothing)."""
    return round(ours / baseline, 3) if baseline > 0 else None


def summarize(env_id: str, runs: dict[int, dict], schedule: Schedule) -> dict:
    """Per seed the two curves and final returns (their spread says how much a ratio means); over seeds the
    mean curves, and ours / SB3 of the final mean return and of the area under the mean curve."""
    points = schedule.points()
    for seed, run in runs.items():
        for system in ("ours", "sb3"):
            got = [p["env_steps"] for p in run[system]["points"]]
            if got != points:
                raise RuntimeError(f"{system} {env_id} seed {seed}: evaluated at {got}, not at {points}")
    mean = {
        system: [
            round(sum(run[system]["points"][i]["mean_return"] for run in runs.values()) / len(runs), 2)
            for i in range(len(points))
        ]
        for system in ("ours", "sb3")
    }
    areas = {system: area(points, mean[system]) for system in ("ours", "sb3")}
    return {
        "seeds": {str(seed): run for seed, run in runs.items()},
        "mean": {"env_steps": points, **mean},
        "final": {
            "ours": mean["ours"][-1],
            "sb3": mean["sb3"][-1],
            "ratio": ratio(mean["ours"][-1], mean["sb3"][-1]),
            "by_seed": {
                system: [round(run[system]["points"][-1]["mean_return"], 2) for run in runs.values()]
                for system in ("ours", "sb3")
            },
        },
        "auc": {
            "ours": round(areas["ours"], 2),
            "sb3": round(areas["sb3"], 2),
            "ratio": ratio(areas["ours"], areas["sb3"]),
        },
    }


def table(result: dict) -> str:
    """Markdown: mean return over seeds at each evaluation point, both systems, and the two ratios."""
    points = result["config"]["points"]
    head = (
        "| env | system | "
        + " | ".join(f"{p / 1000:g}k" for p in points)
        + f" | {points[-1] / 1000:g}k by seed | final ratio | AUC ratio |"
    )
    lines = [head, "|" + "---|" * (len(points) + 5)]
    for env_id, env in result["envs"].items():
        for system, name in (("ours", "user-rl SAC"), ("sb3", "SB3 SAC")):
            cells = " | ".join(f"{value:.0f}" for value in env["mean"][system])
            by_seed = " / ".join(f"{value:.0f}" for value in env["final"]["by_seed"][system])
            ratios = (
                " | ".join("-" if r is None else f"{r:.2f}x" for r in (env["final"]["ratio"], env["auc"]["ratio"]))
                if system == "ours"
                else " | "
            )
            lines.append(f"| {env_id} | {name} | {cells} | {by_seed} | {ratios} |")
    seeds = len(result["config"]["seeds"])
    lines.append(
        f"\nmean return of {result['config']['eval_episodes']} deterministic episodes, mean over {seeds} "
        f"seed{'s' if seeds > 1 else ''}; ratio = ours / SB3 (final: at {points[-1]:,} env steps; AUC: "
        "area under the mean curve); by seed: the final return of each seed, in seed order"
    )
    return "\n".join(lines)


def compare(envs: list[str], seeds: list[int], schedule: Schedule, jobs: int, root: Path) -> dict:
    """Every (system, env, seed) run, `jobs` at a time; the JSON result."""
    started = time.monotonic()
    # seed by seed, so that a comparison stopped part-way has whole seeds of every env to report (--seeds 0)
    tasks = [(system, env_id, seed) for seed in seeds for env_id in envs for system in ("ours", "sb3")]
    read_back = sum(result_file(root, *task).exists() for task in tasks)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {task: pool.submit(run_or_read, *task, schedule, root) for task in tasks}
        done = {}
        for task, future in futures.items():
            done[task] = future.result()
            print(
                f"[{time.monotonic() - started:6.0f}s] {task[0]} {task[1]} seed {task[2]}: "
                f"{[round(p['mean_return']) for p in done[task]['points']]} in {done[task]['wall_s']:.0f} s",
                flush=True,
            )
    env_results = {
        env_id: summarize(
            env_id,
            {seed: {system: done[(system, env_id, seed)] for system in ("ours", "sb3")} for seed in seeds},
            schedule,
        )
        for env_id in envs
    }
    wall = {system: sum(r["wall_s"] for (s, _, _), r in done.items() if s == system) for system in ("ours", "sb3")}
    steps = schedule.steps * len(envs) * len(seeds)
    return {
        "config": {
            "envs": envs,
            "seeds": seeds,
            **asdict(schedule),
            "points": schedule.points(),
            "jobs": jobs,
            "matched": MATCHED,
            "ours": our_config("ENV", 0, schedule, Path("RUN_ROOT")),
            "sb3": {k: v for k, v in sb3_kwargs(schedule, 0).items() if k != "seed"},
        },
        "envs": env_results,
        "wall_s": round(time.monotonic() - started, 1),  # of this call: see runs_read_back
        "runs_read_back": read_back,  # finished by an earlier call (--runs-dir), their time is in run_wall_s
        "run_wall_s": {system: round(seconds, 1) for system, seconds in wall.items()},
        "env_steps_per_s": {system: round(steps / max(seconds, 1e-9), 1) for system, seconds in wall.items()},
        "cpus": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", help=f"gymnasium env ids (default: {' '.join(ENVS)})")
    parser.add_argument("--seeds", nargs="+", type=int, help="default: 0 1 2")
    parser.add_argument("--steps", type=int, help="env steps per run (default 50000)")
    parser.add_argument("--eval-every", type=int, help="env steps between evaluations (default 10000)")
    parser.add_argument("--eval-episodes", type=int, help="deterministic episodes per evaluation (default 10)")
    parser.add_argument(
        "--learning-starts",
        type=int,
        help="random steps before the first update (default 5000; "
        "SB3's own default is 100, rl-zoo's for these envs 10000)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke check: HalfCheetah-v5, seed 0, 3000 steps, evaluations every 1000 of 2 episodes, "
        "learning from 1000 (flags given as well win)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs side by side (each run uses about 2 cores)")
    parser.add_argument(
        "--runs-dir",
        type=Path,
        help="keep every run's directory, log and result here (default: a "
        "temp dir, removed at the end); run again with the same dir to "
        "resume: finished runs are read back, not rerun",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/sample_efficiency.json")
    parser.add_argument("--sb3-run", nargs=2, metavar=("ENV", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    quick = {
        "envs": ["HalfCheetah-v5"],
        "seeds": [0],
        "steps": 3000,
        "eval_every": 1000,
        "eval_episodes": 2,
        "learning_starts": 1000,
    }
    full = {
        "envs": list(ENVS),
        "seeds": [0, 1, 2],
        "steps": 50_000,
        "eval_every": 10_000,
        "eval_episodes": 10,
        "learning_starts": 5000,
    }
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not 1 <= args.learning_starts <= args.eval_every <= args.steps:
        # an evaluation publishes the actor, and an edge acts randomly only until its first actor arrives
        parser.error(
            f"need 1 <= --learning-starts <= --eval-every <= --steps (no evaluation before learning "
            f"starts: it would end our random warm-up early); got --learning-starts {args.learning_starts}, "
            f"--eval-every {args.eval_every}, --steps {args.steps}"
        )
    schedule = Schedule(args.steps, args.eval_every, args.eval_episodes, args.learning_starts)
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        print(SB3_MISSING, file=sys.stderr)
        return 2
    if args.sb3_run:
        env_id, seed = args.sb3_run
        args.out.write_text(json.dumps(run_sb3_here(env_id, int(seed), schedule)))
        return 0
    root = (args.runs_dir or Path(tempfile.mkdtemp(prefix="sample-efficiency-"))).resolve()  # runs start there
    root.mkdir(parents=True, exist_ok=True)
    recorded = root / "schedule.json"
    if recorded.exists() and json.loads(recorded.read_text()) != asdict(schedule):
        parser.error(
            f"{root} holds runs of another schedule ({recorded.read_text().strip()}); "
            f"resume with the same --steps, --eval-every, --eval-episodes and --learning-starts, "
            f"or give another --runs-dir"
        )
    recorded.write_text(json.dumps(asdict(schedule)))
    try:
        result = compare(args.envs, args.seeds, schedule, args.jobs, root)
    except Exception:
        print(f"runs and their logs are kept in {root}", file=sys.stderr)
        raise
    if args.runs_dir is None:
        shutil.rmtree(root, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print()
    print(table(result))
    earlier = f" ({result['runs_read_back']} runs read back)" if result["runs_read_back"] else ""
    print(
        f"\n{result['wall_s']:.0f} s in all{earlier}; env steps/s per run: ours {result['env_steps_per_s']['ours']}, "
        f"SB3 {result['env_steps_per_s']['sb3']}; {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
