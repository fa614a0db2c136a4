"""Deterministic evaluation of an actor on fresh episodes of a robot.

Evaluation seeds come from their own range, so the episodes differ from the training ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from user_rl.hal.robot import Robot
from user_rl.policies.chunking import ChunkRunner
from user_rl.robots.safety import ActionFilter

EVAL_SEED_BASE = 1_000_000


@dataclass
class EvalResult:
    episodes: int
    success_rate: float | None  # None when the task reports no success flag
    mean_return: float
    mean_length: float

    def as_dict(self) -> dict:
        return asdict(self)

    def meets(self, success_rate: float | None, mean_return: float | None) -> bool:
        """True when every configured goal is reached (and at least one is configured)."""
        goals = []
        if success_rate is not None:
            goals.append(self.success_rate is not None and self.success_rate >= success_rate)
        if mean_return is not None:
            goals.append(self.mean_return >= mean_return)
        return bool(goals) and all(goals)


@torch.no_grad()
def evaluate(robot: Robot, actor: nn.Module, episodes: int, seed: int = 0) -> EvalResult:
    actor.eval()
    safety = ActionFilter(robot.action_space)
    policy = ChunkRunner(actor, deterministic=True)  # a chunk policy executes its chunks open loop, as on an edge
    successes: list[bool] = []
    returns, lengths = [], []
    for episode in range(episodes):
        obs = robot.reset(seed=EVAL_SEED_BASE + seed * 10_000 + episode)
        policy.restart()
        total, steps = 0.0, 0
        while True:
            action, _ = policy(obs)
            result = robot.step(safety(action))
            total += result.reward
            steps += 1
            obs = result.observation
            if result.terminated or result.truncated:
                if "is_success" in result.info:
                    successes.append(bool(result.info["is_success"]))
                break
        returns.append(total)
        lengths.append(steps)
    return EvalResult(
        episodes=episodes,
        success_rate=float(np.mean(successes)) if successes else None,
        mean_return=float(np.mean(returns)),
        mean_length=float(np.mean(lengths)),
    )


def evaluate_checkpoint(
    path: str | Path, episodes: int = 20, seed: int = 1, overrides: list[str] | None = None
) -> dict:
    """Rebuild a run's robot and actor from its checkpoint and evaluate them. `overrides` change the
    run's config first (e.g. `robot.options.reward=sparse`: judge on the task's sparse variant)."""
    from user_rl.cloud.checkpoint import load_checkpoint
    from user_rl.config import build_config
    from user_rl.hal.registry import make_robot

    ckpt = load_checkpoint(path)
    cfg = build_config(ckpt["config"], overrides)
    options = {**cfg.robot_options(0), "robot_id": "eval"}
    with make_robot(cfg.robot.type, **options) as robot:
        result = evaluate(robot, checkpoint_actor(ckpt, robot), episodes, seed=seed)
    return {"policy_version": ckpt["policy_version"], "robot": cfg.robot.type, **result.as_dict()}


def checkpoint_actor(ckpt: dict, robot: Robot) -> nn.Module:
    """The checkpoint's actor (as its run's algorithm ran it), built for `robot`'s spaces, with its weights loaded."""
    from user_rl.algos import make_run_actor
    from user_rl.config import build_config

    cfg = build_config(ckpt["config"])
    actor = make_run_actor(cfg.policy, cfg.algo, robot.observation_space, robot.action_space)
    actor.load_state_dict(ckpt["actor"])
    return actor
