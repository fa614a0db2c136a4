"""End to end: DrQ learns reach from pixels. The state holds only the arm; where the target is,
only the 24x24 top-camera image says (`configs/reach_pixels.yaml`).

Then the proof that the pixels steer it: each step the policy is shown the scene with the target
somewhere else (a second sim mirrors the arm's pose). It reaches for the target it is shown.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.e2e.harness import evaluate, train
from user_rl.cloud.checkpoint import load_checkpoint
from user_rl.config import build_config
from user_rl.evaluation import checkpoint_actor
from user_rl.hal.registry import make_robot
from user_rl.sim.reach import ReachRobot

# Judged on as few episodes as keep the bars sure (each costs a `user-rl eval` of rendered steps).
# Measured policies reach 0.93-0.97 on fresh episodes: below
# 0.8 on 30 episodes 1 run in 250 at 0.93, 1 in 40 even at 0.90 (binomial). The swap measured 0.98
# at the shown target and 0.02 at the real one: on 20 episodes, even at 0.90 / 0.10 the bars of
# 0.6 / 0.2 fail under 1 run in 20.
FRESH_EPISODES = 30
SWAPPED_EPISODES = 20


def reach_what_it_is_shown(checkpoint: str, episodes: int) -> tuple[float, float]:
    """(share of episodes that end at the target the image showed, share at the real one)."""
    ckpt = load_checkpoint(checkpoint)
    cfg = build_config(ckpt["config"])
    options = cfg.robot_options(0)
    with make_robot(cfg.robot.type, **options) as robot, make_robot(cfg.robot.type, **options) as shown:
        assert isinstance(robot, ReachRobot) and isinstance(shown, ReachRobot)
        actor = checkpoint_actor(ckpt, robot).eval()
        at_shown = at_real = 0
        for episode in range(episodes):
            obs = robot.reset(seed=50_000 + episode)
            shown.reset(seed=60_000 + episode)
            decoy = shown.target_pos
            for _ in range(robot.episode_steps):
                shown.data.qpos[:], shown.data.qvel[:] = robot.data.qpos, robot.data.qvel
                image = shown.set_target(decoy)["image"]  # the arm as it is, the target elsewhere
                batch = {"state": torch.as_tensor(obs["state"])[None], "image": torch.as_tensor(image)[None]}
                obs = robot.step(actor.act(batch, deterministic=True)[0].numpy()).observation
            at_shown += np.linalg.norm(robot.ee_pos - decoy) < robot.success_distance
            at_real += robot.distance < robot.success_distance
    return at_shown / episodes, at_real / episodes


@pytest.mark.long
@pytest.mark.timeout(1500)
def test_drq_learns_reach_from_pixels_alone(tmp_path: Path, seed_overrides: tuple[str, ...]) -> None:
    # Evaluated every 30 s, not the config's 60, so the run stops soon after it reaches its goal twice; a
    # goal of 0.9, not 0.8, since stopping sooner stopped one run on a policy of 0.90 (seed 1; seed 0: 0.97)
    summary = train(
        "configs/reach_pixels.yaml",
        tmp_path,
        *seed_overrides,
        "stop.eval_every_s=30",
        "stop.success_rate=0.9",
        timeout=1200,
        learning=True,
    )
    fresh = evaluate(summary["checkpoint"], FRESH_EPISODES, 11)
    print(
        f"\nDrQ on reach from 24x24 pixels: success {fresh['success_rate']:.2f} on {FRESH_EPISODES} fresh episodes "
        f"after {summary['learner']['env_steps']:,} env steps ({summary['stop_reason']})"
    )
    assert fresh["success_rate"] >= 0.8, (fresh, summary["stdout"][-3000:])

    shown, real = reach_what_it_is_shown(summary["checkpoint"], SWAPPED_EPISODES)
    print(f"shown the target elsewhere: ends at the shown target {shown:.2f}, at the real one {real:.2f}")
    assert shown >= 0.6 and real <= 0.2
