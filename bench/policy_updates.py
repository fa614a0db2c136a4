"""Learner update throughput of a config's algorithm and policy, as a ratio to a plain PyTorch step.

Ours, per update: the columns of a buffer batch are turned into the algorithm's training columns
(`training_columns`: derived intervention weights, chunk columns), put on the device
(`training_batch`, as the trainer process does with a slot) and passed to `algo.update`, exactly
the trainer's work once a batch waits in its slot. Sampling is not included: `bench/buffer_*.py`
measure it, and the learner prepares batches in another thread while the trainer updates.

Raw baseline, in the same run: a fresh copy of the same actor network trained by the plainest
supervised step there is, with tensors already on the device: its encoder on the observations, a
linear layer to the action (or the action chunk), mean squared error, backward, Adam. The ratio
ours/raw (in updates per second) says what the algorithm costs beyond touching the network once:
SAC and DrQ also run two critics and a target, flow matching runs its head, and so on.

Batches are random, drawn from the robot's spaces (the config's robot is asked for them, as the
learner does), so nothing is trained and only the rate means anything.

    python bench/policy_updates.py configs/reach_pixels.yaml [--batch 256] [--device cuda] [--updates 200]
    python bench/policy_updates.py configs/reach_vla.yaml policy.size=100m --device cuda
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from user_rl.algos import algo_settings, make_algo  # noqa: E402
from user_rl.cloud.batches import training_columns  # noqa: E402
from user_rl.cloud.buffer.store import NEXT_OBS  # noqa: E402
from user_rl.cloud.trainer import training_batch  # noqa: E402
from user_rl.config import load_config  # noqa: E402
from user_rl.hal.registry import robot_spaces  # noqa: E402
from user_rl.wire import user_rl_pb2 as pb  # noqa: E402
from user_rl.wire.transitions import OBS  # noqa: E402


def buffer_batch(obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, batch: int, horizon: int, n_step: int,
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random columns shaped as `PersistentReplay.sample` returns them (half the rows intervened)."""
    out: dict[str, np.ndarray] = {}
    for key, space in obs_space.spaces.items():
        for prefix in (OBS, NEXT_OBS):
            if space.dtype == np.uint8:
                out[prefix + key] = rng.integers(0, 256, (batch, *space.shape), dtype=np.uint8)
            else:
                out[prefix + key] = rng.standard_normal((batch, *space.shape)).astype(space.dtype)
    low, high = action_space.low, action_space.high
    out["action"] = rng.uniform(low, high, (batch, *action_space.shape)).astype(np.float32)
    out["reward"] = rng.standard_normal(batch).astype(np.float32)
    out["terminated"] = rng.random(batch) < 0.05
    out["actor"] = rng.choice([pb.ACTOR_POLICY, pb.ACTOR_HUMAN], batch).astype(np.uint8)
    if n_step > 1:  # the buffer gives a discount column only for n-step returns
        out["discount"] = np.full(batch, 0.99 ** n_step, np.float32)
    if horizon > 1:
        out["action_chunk"] = rng.uniform(low, high, (batch, horizon, *action_space.shape)).astype(np.float32)
        out["chunk_mask"] = np.ones((batch, horizon), bool)
        out["chunk_actor"] = rng.choice([pb.ACTOR_POLICY, pb.ACTOR_HUMAN], (batch, horizon)).astype(np.uint8)
    return out


class PlainStep:
    """The raw baseline: the actor's encoder, a linear layer to the (chunk of) actions, MSE, Adam.
    A frozen encoder (`policy.freeze`) stays frozen here too: both sides train the same parts."""

    def __init__(self, actor: nn.Module, targets: int, device: torch.device) -> None:
        self.encoder = copy.deepcopy(actor.encoder).to(device)
        self.head = nn.Linear(self.encoder.out_dim, targets).to(device)
        trained = [p for p in [*self.encoder.parameters(), *self.head.parameters()] if p.requires_grad]
        self.optim = torch.optim.Adam(trained, lr=3e-4)

    def update(self, obs: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        loss = (self.head(self.encoder(obs)) - target.flatten(1)).pow(2).mean()
        self.optim.zero_grad(set_to_none=True)
        loss.backward()
        self.optim.step()
        return loss.detach()


def timed(step, updates: int, device: torch.device) -> float:
    """Updates per second over `updates` calls of `step` (after the warm-up the caller did)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(updates):
        last = step()
    float(last)  # waits for the device
    return updates / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*", help="config overrides, as for `user-rl train`")
    parser.add_argument("--batch", type=int, default=None, help="default: the config's algo.batch_size")
    parser.add_argument("--updates", type=int, default=100, help="timed updates per round")
    parser.add_argument("--rounds", type=int, default=3, help="ours/raw alternations; the best round counts")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="a few updates, for the smoke test")
    parser.add_argument("--out", default=None)
    args = parser.parse_intermixed_args()  # overrides may come before or after the options
    if args.quick:
        args.updates, args.rounds = 3, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("MUJOCO_GL", "egl")
    cfg = load_config(args.config, args.overrides)
    device = torch.device(args.device)
    batch_size = args.batch or cfg.algo.batch_size
    obs_space, action_space = robot_spaces(cfg.robot.type, cfg.robot_options(0))
    torch.manual_seed(cfg.seed)
    algo = make_algo(cfg.algo.type, obs_space, action_space, cfg.policy.type, cfg.policy.options(),
                     algo_settings(cfg.algo.type, cfg.algo.model_dump()), device)
    horizon = cfg.buffer.action_horizon
    rng = np.random.default_rng(cfg.seed)
    host_batches = [{key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in
                     training_columns(buffer_batch(obs_space, action_space, batch_size, horizon,
                                                   cfg.buffer.n_step, rng),
                                      algo.batch_columns).items()} for _ in range(4)]
    plain = PlainStep(algo.actor, int(np.prod(action_space.shape)) * max(horizon, 1), device)
    on_device = [training_batch(columns, device) for columns in host_batches]
    target = "action_chunk" if horizon > 1 else "action"

    host_cycle, device_cycle = itertools.cycle(host_batches), itertools.cycle(on_device)

    def ours() -> torch.Tensor:
        metrics = algo.update(training_batch(next(host_cycle), device))
        return next(iter(metrics.values()))

    def raw() -> torch.Tensor:
        batch = next(device_cycle)
        return plain.update(batch["obs"], batch[target])

    for step in (ours, raw):  # warm-up: allocator, kernels, Adam's state
        timed(step, 2, device)
    rounds = [{"ours": timed(ours, args.updates, device), "raw": timed(raw, args.updates, device)}
              for _ in range(args.rounds)]
    best_ours, best_raw = max(r["ours"] for r in rounds), max(r["raw"] for r in rounds)
    total = sum(p.numel() for p in algo.actor.parameters())
    trainable = sum(p.numel() for p in algo.actor.parameters() if p.requires_grad)
    result = {
        "config": {"file": args.config, "overrides": args.overrides, "algo": cfg.algo.type,
                   "policy": cfg.policy.summary(), "batch": batch_size, "device": str(device),
                   "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                   "threads": torch.get_num_threads(), "updates": args.updates},
        "actor_parameters": total, "actor_trainable_parameters": trainable,
        "ours": {"updates_per_s": best_ours, "samples_per_s": best_ours * batch_size},
        "raw": {"updates_per_s": best_raw, "samples_per_s": best_raw * batch_size},
        "ratio": best_ours / best_raw, "rounds": rounds,
    }
    print(f"{cfg.algo.type} / {cfg.policy.summary()} on {result['config']['device_name']}, batch {batch_size}, "
          f"actor {total / 1e6:.2f}M parameters ({trainable / 1e6:.2f}M trained): "
          f"{best_ours:.1f} updates/s ({best_ours * batch_size:,.0f} samples/s); plain step {best_raw:.1f}/s; "
          f"ratio ours/raw {result['ratio']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
