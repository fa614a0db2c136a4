"""How much room a cloned chunk policy leaves for DSRL: success when each chunk's noise is picked by
a greedy oracle, against the base drawing its noise as trained.

DSRL can only choose among the chunks the base makes. Before steering a base, this tells whether the
chunks that succeed are among them: at every chunk the oracle tries `--tries` noises in a copy of
the sim (`ReachRobot.snapshot` / `restore`), runs the one whose chunk touched the target or ended
closest to it, and goes on from there. Noises are drawn as the steering actor can pick them:
uniform in [-noise_bound, noise_bound], for the whole chunk or one row shared over it.

    python bench/steering_room.py RUN/checkpoint.pt             # a flow base on mujoco_reach
    python bench/steering_room.py RUN/checkpoint.pt --tries 4 --episodes 50

Measured on a 0.33 base of configs/reach_flow_bc.yaml (seed 0 of bench/steering.py, 100 episodes,
16 tries): 0.97 with the whole chunk's noise, 1.00 with one shared row (4 tries: 0.74).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import write_result  # noqa: E402
from user_rl.cloud.checkpoint import load_checkpoint  # noqa: E402
from user_rl.config import build_config  # noqa: E402
from user_rl.policies import make_actor  # noqa: E402
from user_rl.sim.reach import ReachRobot  # noqa: E402


def episode_success(robot: ReachRobot, base: torch.nn.Module, draw, tries: int, seed: int) -> bool:
    """One episode: each chunk from the best of `tries` noises `draw(n)` gives (1: just the base's draw)."""
    obs = robot.reset(seed=seed)
    while True:
        batch = {key: torch.as_tensor(value).unsqueeze(0).repeat_interleave(tries, 0) for key, value in obs.items()}
        with torch.no_grad():
            chunks = base.to_robot_units(base.chunk_from_noise(batch, draw(tries))).numpy()
        best = 0
        if tries > 1:
            start, scores = robot.snapshot(), []
            for chunk in chunks:
                robot.restore(start)
                for action in chunk:
                    result = robot.step(action)
                    if result.terminated or result.truncated:
                        break
                scores.append(-1.0 if result.info["is_success"] else result.info["distance"])
            robot.restore(start)
            best = int(np.argmin(scores))
        for action in chunks[best]:
            result = robot.step(action)
            obs = result.observation
            if result.terminated or result.truncated:
                return bool(result.info["is_success"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--tries", type=int, default=16, help="noises the oracle tries per chunk")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--noise-bound", type=float, default=1.5, help="as algo.noise_bound")
    parser.add_argument("--out", default="bench/results/steering_room.json")
    args = parser.parse_args()
    ckpt = load_checkpoint(args.checkpoint)
    cfg = build_config(ckpt["config"])
    robot = ReachRobot(**{**cfg.robot_options(0), "robot_id": "oracle"})
    base = make_actor(cfg.policy.type, robot.observation_space, robot.action_space, **cfg.policy.options())
    base.load_state_dict(ckpt["actor"])
    base.eval()
    if not hasattr(base, "chunk_from_noise"):
        raise SystemExit(f"{cfg.policy.type} is not steered through its noise (flow and vla are)")
    rows, width = base.noise_shape
    generator = torch.Generator().manual_seed(0)

    def uniform(n: int, size: int) -> torch.Tensor:
        return (torch.rand(n, size, generator=generator) * 2 - 1) * args.noise_bound

    draws = {
        "base (noise as trained)": (1, lambda n: torch.randn(n, rows * width, generator=generator)),
        f"oracle, whole chunk's noise, {args.tries} tries": (args.tries, lambda n: uniform(n, rows * width)),
        f"oracle, one shared row, {args.tries} tries": (args.tries, lambda n: uniform(n, width).repeat(1, rows)),
    }
    found = {}
    for name, (tries, draw) in draws.items():
        successes = [episode_success(robot, base, draw, tries, 10_000 + e) for e in range(args.episodes)]
        found[name] = float(np.mean(successes))
        print(f"{name}: success {found[name]:.2f} on {args.episodes} episodes", flush=True)
    write_result(args.out, {"checkpoint": str(args.checkpoint), "episodes": args.episodes, "success": found})


if __name__ == "__main__":
    main()
