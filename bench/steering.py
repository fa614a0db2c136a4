"""Post-training one behaviour-cloned flow policy on sparse reach, by each method, with the same env steps.

Per seed: the base is cloned first (configs/reach_flow_bc.yaml: 4,000 env steps of HG-DAgger with the
scripted expert) and evaluated; then every method starts from that base (`policy.weights`) with the
base run's buffer attached as demonstrations, learns from the sparse reward alone, and is evaluated
on 100 fresh episodes at every `--every` env steps up to `--steps` (`stop.eval_every_env_steps`: a
paced fleet holds at each point until the learner has made the updates those steps earn). Methods:

- dsrl (configs/reach_dsrl.yaml): the flow frozen, a small actor picks its noise;
- residual (configs/reach_residual.yaml): the flow frozen, a small actor corrects its actions;
- qc (configs/reach_flow_qc.yaml): the whole flow fine-tuned on the chunks a chunk critic picks (best of 8);
- flow_ql (configs/reach_flow_ql.yaml): the whole flow fine-tuned up a chunk critic (Diffusion-QL);
- dsrl_people: dsrl with a person in the loop: the scripted expert watches a quarter of the episodes
  and takes over where the policy is stuck (`intervention.watched_fraction`); the chunk critic
  learns from those rows as well (`buffer.mix` samples them).

Every method runs at the same updates per env step (`--utd`, 2.0: what DSRL needs here). The bytes
each published version carries to an edge are counted from the method's actor (what moves after the
first version: the frozen base goes once).

Prints the table for docs/benchmarks.md (success per method at each point, mean and range over the
seeds) and writes every point to `--out` after each run. Each run is `user-rl train` in a process of
its own, so a stopped bench resumes where it was with the same line (finished runs are kept in
`--runs-dir`). `--out` keeps what earlier benches of the same settings measured: seeds not run now
stay, and running some methods of a seed again keeps the others' points if its base is the same run.

    python bench/steering.py                                   # 3 seeds, 20,000 steps (about 5 h on 2 cores)
    python bench/steering.py --quick                           # 1 seed, 2,000 steps: a smoke check
    python bench/steering.py --methods dsrl --seeds 0 --set algo.utd_ratio=1.0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import checkout_env, write_result  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BASE = "configs/reach_flow_bc.yaml"
METHODS = {
    "dsrl": "configs/reach_dsrl.yaml",
    "residual": "configs/reach_residual.yaml",
    "qc": "configs/reach_flow_qc.yaml",
    "flow_ql": "configs/reach_flow_ql.yaml",
    "dsrl_people": "configs/reach_dsrl.yaml",
}
PEOPLE = [  # a person in the loop for a quarter of the episodes; their rows are sampled too
    "intervention.scripted=true",
    "intervention.watched_fraction=0.25",
    "buffer.mix={online: 0.4, demo: 0.3, intervention: 0.3}",
]
OVERRIDES = {"dsrl_people": PEOPLE}
EVAL_EPISODES = 100


def train(config: str, run_root: Path, overrides: list[str]) -> dict:
    """`user-rl train config overrides` in its own process; its summary (kept: a finished run is not redone)."""
    done_file = run_root / "summary.json"
    if done_file.is_file():
        return json.loads(done_file.read_text())
    shutil.rmtree(run_root, ignore_errors=True)  # an unfinished run starts again
    run_root.mkdir(parents=True)
    started = time.monotonic()
    with open(run_root / "train.log", "w") as log:
        done = subprocess.run(
            [sys.executable, "-m", "user_rl.cli", "train", str(REPO / config), f"run_root={run_root}", *overrides],
            cwd=run_root,  # MuJoCo writes its MUJOCO_LOG.TXT where it runs
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**checkout_env(), "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")},
        )
    summaries = list(run_root.glob("*/summary.json"))
    if done.returncode != 0 or not summaries:
        raise RuntimeError(f"{config}: user-rl train exited {done.returncode}; see {run_root / 'train.log'}")
    summary = json.loads(summaries[0].read_text())
    summary["bench_wall_s"] = round(time.monotonic() - started, 1)
    done_file.write_text(json.dumps(summary))
    return summary


def earlier_result(out: str, args: argparse.Namespace) -> dict:
    """What an earlier bench wrote to `out` with the same settings (a runs directory can be lost
    between sessions; the measured points are not); {} if nothing, or other settings."""
    path = Path(out)
    if not path.is_file():
        return {}
    earlier = json.loads(path.read_text())
    settings = {"steps": args.steps, "every": args.every, "utd_ratio": args.utd, "overrides": args.set}
    if any(earlier.get(key) != value for key, value in settings.items()):
        return {}
    return earlier


def same_base(one: dict, other: dict) -> bool:
    """Whether two seeds' base entries are the same cloned run (its checkpoint; older entries: its numbers)."""
    if "checkpoint" in one and "checkpoint" in other:
        return one["checkpoint"] == other["checkpoint"]
    return (one["success_rate"], one["env_steps"]) == (other["success_rate"], other["env_steps"])


def points(summary: dict) -> list[dict]:
    return [
        {"env_steps": e["env_steps"], "updates": e["updates"], "success_rate": e["success_rate"]}
        for e in summary["evaluations"]
    ]


def published_bytes(config: str) -> int:
    """Bytes a new policy version carries to an edge under `config`: the trainable part of its actor."""
    from user_rl.algos import make_algo
    from user_rl.cloud.actor_buffers import ActorBuffers
    from user_rl.config import load_config
    from user_rl.hal.registry import make_robot

    cfg = load_config(REPO / config)
    robot = make_robot(cfg.robot.type, robot_id="bytes", **cfg.robot.options)
    try:
        obs_space, action_space = robot.observation_space, robot.action_space
    finally:
        robot.close()
    algo = make_algo(cfg.algo.type, obs_space, action_space, cfg.policy.type, cfg.policy.options(), cfg.algo)
    return ActorBuffers(algo.actor, count=1).own_layout.total_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20000, help="online env steps per method")
    parser.add_argument("--every", type=int, default=5000, help="evaluate at every multiple of this many env steps")
    parser.add_argument("--utd", type=float, default=2.0, help="learner updates per env step, for every method")
    parser.add_argument("--set", nargs="*", default=[], help="overrides for every method's run, e.g. algo.tau=0.005")
    parser.add_argument("--runs-dir", default="runs/bench-steering")
    parser.add_argument("--out", default="bench/results/steering.json")
    parser.add_argument("--quick", action="store_true", help="1 seed, 2,000 steps, evaluated at 1,000 and 2,000")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps, args.every = args.seeds[:1], 2000, 1000
    runs = Path(args.runs_dir).resolve()
    earlier = earlier_result(args.out, args)
    result: dict = {
        "steps": args.steps,
        "every": args.every,
        "utd_ratio": args.utd,
        "overrides": args.set,
        "bytes_per_version": {
            **earlier.get("bytes_per_version", {}),
            **{method: published_bytes(METHODS[method]) for method in args.methods},
        },
        "seeds": {seed: found for seed, found in earlier.get("seeds", {}).items() if int(seed) not in args.seeds},
    }
    print("bytes per published version: " + ", ".join(f"{m} {b:,}" for m, b in result["bytes_per_version"].items()))
    for seed in args.seeds:
        base = train(
            BASE,
            runs / f"base-s{seed}",
            [f"seed={seed}", "stop.eval_every_s=null", f"stop.eval_episodes={EVAL_EPISODES}"],
        )
        base_dir = Path(base["run_dir"])
        found = {
            "base": {
                "success_rate": base["final_eval"]["success_rate"],
                "env_steps": base["learner"]["env_steps"],
                "checkpoint": base["checkpoint"],
            }
        }
        before = earlier.get("seeds", {}).get(str(seed))
        if before and same_base(before["base"], found["base"]):  # the same base: its other methods' points stay
            found.update({m: v for m, v in before.items() if m != "base" and m not in args.methods})
        print(
            f"seed {seed}: base {found['base']['success_rate']:.2f} after {found['base']['env_steps']:,} env steps",
            flush=True,
        )
        for method in args.methods:
            summary = train(
                METHODS[method],
                runs / f"{method}-s{seed}",
                [
                    f"seed={seed}",
                    f"policy.weights={base['checkpoint']}",
                    f"buffer.attach=[{{path: {base_dir / 'buffer'}, source: demo}}]",
                    f"stop.max_env_steps={args.steps}",
                    f"stop.eval_every_env_steps={args.every}",
                    "stop.eval_every_s=null",
                    f"stop.eval_episodes={EVAL_EPISODES}",
                    "stop.max_wall_s=7200",
                    f"algo.utd_ratio={args.utd}",
                    *OVERRIDES.get(method, []),
                    *args.set,
                ],
            )
            found[method] = {
                "points": points(summary),
                "wall_s": summary.get("bench_wall_s"),
                "intervention_steps": sum(edge.get("intervention_steps", 0) for edge in summary["edges"]),
            }
            curve = ", ".join(f"{p['success_rate']:.2f} at {p['env_steps']:,}" for p in found[method]["points"])
            print(f"seed {seed}: {method} {curve}", flush=True)
            result["seeds"][str(seed)] = found  # written after every run: a stopped bench keeps what it measured
            write_result(args.out, result)
    print_table(result, args.methods)


def print_table(result: dict, methods: list[str]) -> None:
    """Success on 100 fresh episodes per method and point: the mean over seeds, then each seed's."""
    seeds = result["seeds"]
    steps = sorted(
        {p["env_steps"] for found in seeds.values() for m in methods for p in found.get(m, {}).get("points", [])}
    )
    bases = [found["base"]["success_rate"] for found in seeds.values()]
    base_cell = f"{sum(bases) / len(bases):.2f} ({', '.join(f'{b:.2f}' for b in bases)})"
    print(f"\n| method | {' | '.join(f'{s:,} env steps' for s in steps)} |")
    print(f"|---|{'---|' * len(steps)}")
    print(f"| base (cloned, before) | {' | '.join([base_cell] * len(steps))} |")
    for method in methods:
        cells = []
        for step in steps:
            at = [
                p["success_rate"]
                for found in seeds.values()
                for p in found.get(method, {}).get("points", [])
                if p["env_steps"] == step
            ]
            cells.append(f"{sum(at) / len(at):.2f} ({', '.join(f'{v:.2f}' for v in at)})" if at else "-")
        print(f"| {method} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
