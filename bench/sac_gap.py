"""Where our SAC's gap to Stable-Baselines3's comes from: our algorithm in SB3's serial loop, with one
thing changed at a time (issue 34, part 3).

`bench/sample_efficiency.py` compares the whole system (edge, link, buffer, asynchronous learner)
with SB3's SAC in one process. This script takes the system away: `user_rl.algos.SAC` (the class the
trainer process runs) acts, stores and updates in one process exactly as SB3 does (step, store,
one update per step after `learning_starts`, the current actor acting), so what is left of the gap
is the algorithm's. Each variant then adds back one thing the system does, or changes one
algorithmic choice, so its effect can be measured on its own:

- `serial`: the algorithm alone, acting with the current actor;
- `lag16`: acting with the actor of up to 16 updates ago (what a paced edge acts with: a version is
  published, fetched and swapped in while the learner runs a batch ahead);
- `delay16`: the updates see a transition only 16 steps after it happened (the edge sends its
  steps in batches of `fleet.batch_transitions`, 16);
- `std1`: the actor starts with a standard deviation of 1 before the tanh, as SB3's does (its
  log-std layer starts near 0); ours is squashed into [-5, 2] and starts near exp(-1.5) = 0.22;
- `alpha1st`: the temperature steps first, on the log-probabilities of actions sampled before the
  critic's step, as SB3 orders its update.

Settings are `bench/sample_efficiency.py`'s (MATCHED; learning_starts 5,000; 10 deterministic
episodes per point, seeded as there); SB3's curves come from its JSON (`--sb3-from`, the same
schedule) or are run here (`--with-sb3`). One torch thread per run; `--jobs` runs side by side.

    python bench/sac_gap.py --envs HalfCheetah-v5 --seeds 0 1 2 --steps 30000 --variants serial std1 --jobs 2
    python bench/sac_gap.py --quick          # HalfCheetah, 1 seed, 3,000 steps, two variants: a smoke check
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import write_result  # noqa: E402
from bench.sample_efficiency import MATCHED, Schedule, area, eval_seed, play, run_sb3_here  # noqa: E402

VARIANTS = ("serial", "lag16", "delay16", "std1", "alpha1st")
REPO = Path(__file__).resolve().parent.parent


class Replay:
    """Every transition, in arrays; a uniform batch of those at least `delay` steps old."""

    def __init__(self, capacity: int, obs_dim: int, action_dim: int) -> None:
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), np.float32)
        self.action = np.zeros((capacity, action_dim), np.float32)
        self.reward = np.zeros(capacity, np.float32)
        self.terminated = np.zeros(capacity, bool)
        self.size = 0

    def add(self, obs, action, reward, next_obs, terminated) -> None:
        i = self.size
        self.obs[i], self.action[i], self.reward[i], self.next_obs[i], self.terminated[i] = (
            obs,
            action,
            reward,
            next_obs,
            terminated,
        )
        self.size += 1

    def sample(self, batch: int, rng: np.random.Generator, delay: int) -> dict:
        import torch

        idx = rng.integers(0, max(1, self.size - delay), batch)
        return {
            "obs": {"state": torch.from_numpy(self.obs[idx])},
            "next_obs": {"state": torch.from_numpy(self.next_obs[idx])},
            "action": torch.from_numpy(self.action[idx]),
            "reward": torch.from_numpy(self.reward[idx]),
            "terminated": torch.from_numpy(self.terminated[idx]),
        }


def build_sac(env, variant: str):
    """Our SAC with the matched settings, for `env`'s spaces (`std1`: its actor starts at std 1)."""
    import gymnasium as gym
    import torch

    from user_rl.algos import SAC
    from user_rl.algos.sac import SACSettings
    from user_rl.policies.mlp import LOG_STD_MAX, LOG_STD_MIN

    obs_space = gym.spaces.Dict({"state": gym.spaces.Box(-np.inf, np.inf, env.observation_space.shape, np.float32)})
    action_space = gym.spaces.Box(env.action_space.low, env.action_space.high, dtype=np.float32)
    settings = SACSettings(
        gamma=MATCHED["gamma"],
        tau=MATCHED["tau"],
        actor_lr=MATCHED["learning_rate"],
        critic_lr=MATCHED["learning_rate"],
        batch_size=MATCHED["batch_size"],
        init_alpha=MATCHED["init_temperature"],
        target_entropy_scale=1.0,
    )
    sac = SAC(obs_space, action_space, "mlp", {"hidden": MATCHED["hidden"]}, settings)
    if variant == "std1":  # the log-std half of the last layer outputs what the squash maps to 0
        last = sac.actor.trunk[-1]
        action_dim = sac.actor.action_dim
        with torch.no_grad():
            last.bias[action_dim:] = math.atanh(2 * (0.0 - LOG_STD_MIN) / (LOG_STD_MAX - LOG_STD_MIN) - 1)
    return sac


def alpha_first_update(sac, batch: dict) -> None:
    """SB3's order: the temperature steps first, on actions sampled before anything else steps, and the
    critic's target and the actor's loss use the temperature from before that step."""
    import torch
    import torch.nn.functional as F

    from user_rl.algos.base import backed_up, soft_update
    from user_rl.algos.optim import step

    obs, next_obs = batch["obs"], batch["next_obs"]
    alpha = sac.alpha.detach()
    new_action, log_prob = sac.actor.sample(obs)
    step(sac.alpha_optim, -(sac.log_alpha * (log_prob.detach() + sac.target_entropy)).mean())
    with torch.no_grad():
        next_action, next_log_prob = sac.actor.sample(next_obs)
        soft_value = sac.target_q(sac.critic_target(next_obs, next_action)) - alpha * next_log_prob
        td_target = backed_up(batch, soft_value, sac.settings.gamma)
    qs = sac.critic(obs, sac.actor.normalize(batch["action"]))
    step(sac.critic_optim, sum(F.mse_loss(q, td_target) for q in qs))
    q_new = sac.actor_q(sac.critic(obs, new_action))
    step(sac.actor_optim, (alpha * log_prob - q_new).mean())
    soft_update(sac.critic_target, sac.critic, sac.settings.tau)
    sac.updates += 1


def run_serial(env_id: str, seed: int, schedule: Schedule, variant: str) -> dict:
    """Our SAC in SB3's loop, evaluated at the schedule's points (as sample_efficiency.py's SB3 runs)."""
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    env, eval_env = gym.make(env_id), gym.make(env_id)
    env.action_space.seed(seed)
    sac = build_sac(env, variant)
    lag = 16 if variant == "lag16" else 0
    delay = 16 if variant == "delay16" else 0
    acting = copy.deepcopy(sac.actor) if lag else sac.actor
    replay = Replay(schedule.steps, env.observation_space.shape[0], env.action_space.shape[0])
    points: list[dict] = []
    started = time.monotonic()

    def act(actor, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        with torch.no_grad():
            return actor.act({"state": torch.from_numpy(obs[None].astype(np.float32))}, deterministic)[0].numpy()

    obs, _ = env.reset(seed=seed)
    for t in range(1, schedule.steps + 1):
        if t <= schedule.learning_starts:
            action = env.action_space.sample()
        else:
            action = act(acting, obs, deterministic=False)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        replay.add(obs, action, reward, next_obs, terminated)
        obs = next_obs
        if terminated or truncated:
            obs, _ = env.reset()
        if t >= schedule.learning_starts:
            batch = replay.sample(MATCHED["batch_size"], rng, delay)
            alpha_first_update(sac, batch) if variant == "alpha1st" else sac.update(batch)
            if lag and sac.updates % lag == 0:
                acting.load_state_dict(sac.actor.state_dict())
        if t % schedule.eval_every == 0 or t == schedule.steps:
            mean = play(
                lambda o: act(sac.actor, o, deterministic=True),
                eval_env,
                schedule.eval_episodes,
                eval_seed(seed, len(points)),
            )
            points.append({"env_steps": t, "updates": sac.updates, "mean_return": mean})
            print(
                f"{variant} {env_id} seed {seed}: {mean:.0f} at {t:,} ({time.monotonic() - started:.0f} s)", flush=True
            )
    return {"points": points, "wall_s": round(time.monotonic() - started, 1)}


def sb3_curves(path: Path, env_id: str, seeds: list[int], points: list[int]) -> dict[int, list[float]] | None:
    """SB3's returns at `points` per seed from sample_efficiency.py's JSON (None where it lacks any)."""
    if not path.is_file():
        return None
    envs = json.loads(path.read_text())["envs"]
    if env_id not in envs:
        return None
    out = {}
    for seed in seeds:
        run = envs[env_id]["seeds"].get(str(seed), {}).get("sb3")
        at = {p["env_steps"]: p["mean_return"] for p in run["points"]} if run else {}
        if not all(p in at for p in points):
            return None
        out[seed] = [at[p] for p in points]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah-v5", "Walker2d-v5"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=["serial", "std1"], choices=VARIANTS)
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--learning-starts", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--with-sb3", action="store_true", help="run SB3 here too (else read --sb3-from)")
    parser.add_argument("--sb3-from", type=Path, default=REPO / "bench/results/sample_efficiency.json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(REPO / "bench/results/sac_gap.json"))
    args = parser.parse_args()
    if args.quick:
        args.envs, args.seeds, args.variants = ["HalfCheetah-v5"], [0], ["serial", "lag16"]
        args.steps, args.eval_every, args.eval_episodes, args.learning_starts = 3000, 1500, 1, 1000
        args.with_sb3 = False
    schedule = Schedule(args.steps, args.eval_every, args.eval_episodes, args.learning_starts)
    points = schedule.points()
    jobs = [(env_id, seed, variant) for env_id in args.envs for seed in args.seeds for variant in args.variants]
    if args.with_sb3:
        jobs += [(env_id, seed, "sb3") for env_id in args.envs for seed in args.seeds]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {
            job: pool.submit(run_sb3_here, job[0], job[1], schedule)
            if job[2] == "sb3"
            else pool.submit(run_serial, job[0], job[1], schedule, job[2])
            for job in jobs
        }
        runs = {job: future.result() for job, future in futures.items()}
    result: dict = {"schedule": schedule.__dict__, "points": points, "envs": {}}
    for env_id in args.envs:
        curves = {
            variant: {seed: [p["mean_return"] for p in runs[(env_id, seed, variant)]["points"]] for seed in args.seeds}
            for variant in args.variants + (["sb3"] if args.with_sb3 else [])
        }
        if not args.with_sb3 and (sb3 := sb3_curves(args.sb3_from, env_id, args.seeds, points)) is not None:
            curves["sb3"] = sb3
        result["envs"][env_id] = {
            variant: {
                "by_seed": {str(s): c for s, c in by_seed.items()},
                "final": float(np.mean([c[-1] for c in by_seed.values()])),
                "auc": area(points, list(np.mean(list(by_seed.values()), axis=0))),
            }
            for variant, by_seed in curves.items()
        }
    write_result(args.out, result)
    print(f"\n| env | variant | final (mean of {len(args.seeds)} seeds) | by seed | AUC | final vs sb3 | AUC vs sb3 |")
    print("|---|---|---|---|---|---|---|")
    for env_id, variants in result["envs"].items():
        base = variants.get("sb3")
        for variant, found in variants.items():
            by_seed = " / ".join(f"{c[-1]:.0f}" for c in found["by_seed"].values())
            vs = (
                f"{found['final'] / base['final']:.2f}x | {found['auc'] / base['auc']:.2f}x"
                if base and base["final"] > 0 and base["auc"] > 0
                else "- | -"
            )
            print(f"| {env_id} | {variant} | {found['final']:.0f} | {by_seed} | {found['auc']:.0f} | {vs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
