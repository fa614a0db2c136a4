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

SAC on state vectors gets a second baseline, the plain SAC loop: the same update (twin critics,
target, actor, temperature, Polyak) written out CleanRL-style in plain PyTorch, networks of the
same sizes, tensors already on the device. Ours/plain SAC says what this system's SAC costs over
the textbook one. Its critics are two separate networks, as CleanRL's are (ours: one stacked
ensemble), so it is measured only where ours has two critics without LayerNorm: like with like.

`--critics N` (a SAC-family algorithm) also times the same algorithm with an ensemble of N critics
(targets from two drawn at random, RLPD's) against it with two, on the same batches in the same
rounds: what a larger ensemble costs per update (the aim: ten cost at most 1.5x two on a GPU).

Batches are random, drawn from the robot's spaces (the config's robot is asked for them, as the
learner does), so nothing is trained and only the rate means anything.

    python bench/policy_updates.py configs/reach_pixels.yaml [--batch 256] [--device cuda] [--updates 200]
    python bench/policy_updates.py configs/reach.yaml policy.hidden=[256,256] --critics 10
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
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Normal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from user_rl.algos import make_algo  # noqa: E402
from user_rl.algos.graphed import WARMUP, GraphedUpdate, make_updater, training_batch  # noqa: E402
from user_rl.cloud.batches import training_columns  # noqa: E402
from user_rl.cloud.buffer.store import NEXT_OBS  # noqa: E402
from user_rl.config import load_config  # noqa: E402
from user_rl.hal.registry import robot_spaces  # noqa: E402
from user_rl.wire import user_rl_pb2 as pb  # noqa: E402
from user_rl.wire.transitions import OBS  # noqa: E402


def buffer_batch(
    obs_space: gym.spaces.Dict,
    action_space: gym.spaces.Box,
    batch: int,
    horizon: int,
    n_step: int,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
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
        out["discount"] = np.full(batch, 0.99**n_step, np.float32)
    if horizon > 1:
        out["action_chunk"] = rng.uniform(low, high, (batch, horizon, *action_space.shape)).astype(np.float32)
        out["chunk_mask"] = np.ones((batch, horizon), bool)
        out["chunk_actor"] = rng.choice([pb.ACTOR_POLICY, pb.ACTOR_HUMAN], (batch, horizon)).astype(np.uint8)
    return out


class PlainStep:
    """The raw baseline: the actor's encoder, a linear layer to the (chunk of) actions, MSE, Adam.
    A frozen encoder (`policy.freeze`) stays frozen here too: both sides train the same parts."""

    def __init__(self, actor: nn.Module, targets: int, device: torch.device) -> None:
        learned = getattr(actor, "steer", actor)  # a steered base (dsrl, residual) trains its small actor only
        self.encoder = copy.deepcopy(learned.encoder).to(device)
        self.head = nn.Linear(self.encoder.out_dim, targets).to(device)
        trained = [p for p in [*self.encoder.parameters(), *self.head.parameters()] if p.requires_grad]
        self.optim = torch.optim.Adam(trained, lr=3e-4)

    def update(self, obs: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        loss = (self.head(self.encoder(obs)) - target.flatten(1)).pow(2).mean()
        self.optim.zero_grad(set_to_none=True)
        loss.backward()
        self.optim.step()
        return loss.detach()


class PlainSAC:
    """The plain SAC loop (CleanRL's shape): one flat state vector, twin Q-networks, targets, a
    tanh-squashed Gaussian actor, a learned temperature, plain Adam."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int], device: torch.device) -> None:
        def net(inputs: int, outputs: int) -> nn.Sequential:
            layers, width = [], inputs
            for size in hidden:
                layers += [nn.Linear(width, size), nn.ReLU()]
                width = size
            return nn.Sequential(*layers, nn.Linear(width, outputs)).to(device)

        self.actor, self.q1, self.q2 = (
            net(obs_dim, 2 * action_dim),
            net(obs_dim + action_dim, 1),
            net(obs_dim + action_dim, 1),
        )
        self.q1_target, self.q2_target = copy.deepcopy(self.q1), copy.deepcopy(self.q2)
        self.log_alpha = torch.zeros(1, device=device, requires_grad=True)
        self.q_optim = torch.optim.Adam([*self.q1.parameters(), *self.q2.parameters()], lr=3e-4)
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=3e-4)
        self.alpha_optim = torch.optim.Adam([self.log_alpha], lr=3e-4)
        self.target_entropy = -float(action_dim)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.actor(obs).chunk(2, dim=-1)
        log_std = -5.0 + 3.5 * (torch.tanh(log_std) + 1.0)
        normal = Normal(mean, log_std.exp())
        x = normal.rsample()
        action = torch.tanh(x)
        return action, (normal.log_prob(x) - torch.log(1.0 - action.pow(2) + 1e-6)).sum(-1, keepdim=True)

    def update(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
    ) -> torch.Tensor:
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_action, next_log_prob = self.sample(next_obs)
            next_in = torch.cat([next_obs, next_action], 1)
            next_q = torch.min(self.q1_target(next_in), self.q2_target(next_in)) - alpha * next_log_prob
            target = reward.unsqueeze(1) + 0.99 * (1.0 - terminated.float().unsqueeze(1)) * next_q
        taken = torch.cat([obs, action], 1)
        q_loss = F.mse_loss(self.q1(taken), target) + F.mse_loss(self.q2(taken), target)
        self.q_optim.zero_grad()
        q_loss.backward()
        self.q_optim.step()
        new_action, log_prob = self.sample(obs)
        new_in = torch.cat([obs, new_action], 1)
        actor_loss = (alpha * log_prob - torch.min(self.q1(new_in), self.q2(new_in))).mean()
        self.actor_optim.zero_grad()
        actor_loss.backward()
        self.actor_optim.step()
        alpha_loss = (-self.log_alpha.exp() * (log_prob.detach() + self.target_entropy)).mean()
        self.alpha_optim.zero_grad()
        alpha_loss.backward()
        self.alpha_optim.step()
        with torch.no_grad():
            for q, q_target in ((self.q1, self.q1_target), (self.q2, self.q2_target)):
                for param, target_param in zip(q.parameters(), q_target.parameters()):
                    target_param.data.copy_(0.005 * param.data + 0.995 * target_param.data)
        return q_loss.detach()


def update_metric(update, batches: Iterator[dict]) -> torch.Tensor:
    """One update as the trainer makes it: the trainer's updater (`make_updater`: a replayed CUDA graph on a
    GPU) on the next batch of training columns from the host."""
    return next(iter(update(next(batches)).values()))


def replay_metric(graphed: GraphedUpdate) -> torch.Tensor:
    """The captured update replayed on the batch already in its inputs: no copy, no host work (after warm-up)."""
    if not graphed.captured:
        return torch.zeros(())
    graphed.graph.replay()
    return next(iter(graphed.outputs.values()))


def lean_reference(obs_dim: int, action_dim: int, hidden: list[int], device: torch.device):
    """bench/lean_sac.py's LeanSAC, compiled; where torch.compile fails here, the same without it (said so)."""
    from lean_sac import LeanSAC  # beside this file

    lean = LeanSAC(obs_dim, action_dim, hidden, device)
    rows = 256
    probe = [torch.randn(rows, obs_dim, device=device), torch.rand(rows, action_dim, device=device) * 2 - 1]
    probe += [torch.randn(rows, device=device), torch.randn(rows, obs_dim, device=device)]
    probe.append(torch.zeros(rows, device=device))
    try:
        lean.step(*probe)
    except Exception as exc:  # noqa: BLE001 - any compiler failure: the uncompiled graph is the reference then
        print(f"LeanSAC: torch.compile failed ({type(exc).__name__}: {exc}); timing it uncompiled", flush=True)
        lean = LeanSAC(obs_dim, action_dim, hidden, device, compile=False)
    return lean


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
    parser.add_argument("--critics", type=int, default=None, help="also time a SAC-family algorithm with N critics")
    parser.add_argument("--compile", action="store_true", help="on a GPU, also time the update torch.compile'd")
    parser.add_argument("--quick", action="store_true", help="a few updates, for the smoke test")
    parser.add_argument("--out", default=None)
    args = parser.parse_intermixed_args()  # overrides may come before or after the options
    if args.quick:
        args.updates, args.rounds = 3, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("MUJOCO_GL", "egl")
    cfg = load_config(args.config, args.overrides)
    if args.critics and "num_critics" not in type(cfg.algo).model_fields:
        parser.error(f"--critics: algo.type {cfg.algo.type} has no critic ensemble (sac, drq and their kin have)")
    device = torch.device(args.device)
    batch_size = args.batch or cfg.algo.batch_size
    obs_space, action_space = robot_spaces(cfg.robot.type, cfg.robot_options(0))
    torch.manual_seed(cfg.seed)

    def build(settings: object) -> object:
        options = cfg.policy.options()
        return make_algo(cfg.algo.type, obs_space, action_space, cfg.policy.type, options, settings, device)

    algo = build(cfg.algo)  # its algorithm's Settings
    horizon = cfg.action_horizon
    rng = np.random.default_rng(cfg.seed)
    host_batches = [
        {
            key: torch.from_numpy(np.ascontiguousarray(value))
            for key, value in training_columns(
                buffer_batch(obs_space, action_space, batch_size, horizon, cfg.n_step, rng), algo.batch_columns
            ).items()
        }
        for _ in range(4)
    ]
    plain = PlainStep(algo.actor, int(np.prod(action_space.shape)) * max(horizon, 1), device)
    on_device = [training_batch(columns, device) for columns in host_batches]
    target = "action_chunk" if horizon > 1 else "action"

    host_cycle, device_cycle = itertools.cycle(host_batches), itertools.cycle(on_device)
    updater = make_updater(algo, device)

    def ours() -> torch.Tensor:
        return update_metric(updater, host_cycle)

    def raw() -> torch.Tensor:
        batch = next(device_cycle)
        return plain.update(batch["obs"], batch[target])

    steps = {"ours": ours, "raw": raw}
    on_gpu = device.type == "cuda"
    if on_gpu:  # the same algorithm stepped as written, each update's kernels launched one by one
        steps["eager"] = partial(update_metric, make_updater(build(cfg.algo), device, cuda_graph=False), host_cycle)
    if isinstance(updater, GraphedUpdate):  # the graph replayed alone: the device's time per update
        steps["replay"] = partial(replay_metric, updater)
    if on_gpu and args.compile:  # and compiled by torch.compile before capture (`learner.compile`)
        compiled = make_updater(build(cfg.algo), device, compile=True)
        steps["compiled"] = partial(update_metric, compiled, host_cycle)
        steps["compiled_replay"] = partial(replay_metric, compiled)
    for count in (args.critics, 2) if args.critics else ():  # the algorithm with N critics and with two
        ensemble = build(cfg.algo.model_copy(update={"num_critics": count, "target_critics": 2}))
        steps[f"critics_{count}"] = partial(update_metric, make_updater(ensemble, device), host_cycle)
    states = (
        cfg.algo.type == "sac"
        and all(space.dtype != np.uint8 for space in obs_space.spaces.values())
        and (cfg.algo.num_critics, cfg.algo.critic_layer_norm) == (2, False)  # the plain loop's critics
    )
    if states:  # the plain SAC loop on the same batches, the state columns as one vector
        flat = [
            (
                torch.cat([b["obs"][k].flatten(1) for k in sorted(b["obs"])], 1),
                b["action"],
                b["reward"],
                torch.cat([b["next_obs"][k].flatten(1) for k in sorted(b["next_obs"])], 1),
                b["terminated"],
            )
            for b in on_device
        ]
        plain_sac = PlainSAC(flat[0][0].shape[1], int(np.prod(action_space.shape)), cfg.policy.hidden, device)
        flat_cycle = itertools.cycle(flat)
        steps["plain_sac"] = lambda: plain_sac.update(*next(flat_cycle))
        if on_gpu:  # LeanRL's recipe on the plain loop: compiled, a CUDA graph, the batch already on the GPU
            lean = lean_reference(flat[0][0].shape[1], int(np.prod(action_space.shape)), cfg.policy.hidden, device)
            steps["lean_sac"] = lambda: lean.update(*next(flat_cycle))
    for name, step in steps.items():  # warm-up: allocator, kernels, Adam's state, CUDA graph capture
        started = time.perf_counter()
        timed(step, WARMUP + 2, device)
        print(f"{name}: warmed up in {time.perf_counter() - started:.1f} s", flush=True)
    rounds = [{name: timed(step, args.updates, device) for name, step in steps.items()} for _ in range(args.rounds)]
    best_ours, best_raw = max(r["ours"] for r in rounds), max(r["raw"] for r in rounds)
    total = sum(p.numel() for p in algo.actor.parameters())
    trainable = sum(p.numel() for p in algo.actor.parameters() if p.requires_grad)
    result = {
        "config": {
            "file": args.config,
            "overrides": args.overrides,
            "algo": cfg.algo.type,
            "policy": cfg.policy.summary(),
            "batch": batch_size,
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "threads": torch.get_num_threads(),
            "updates": args.updates,
        },
        "actor_parameters": total,
        "actor_trainable_parameters": trainable,
        "ours": {"updates_per_s": best_ours, "samples_per_s": best_ours * batch_size},
        "raw": {"updates_per_s": best_raw, "samples_per_s": best_raw * batch_size},
        "ratio": best_ours / best_raw,
        "rounds": rounds,
    }
    if args.critics:
        many, two = (max(r[f"critics_{count}"] for r in rounds) for count in (args.critics, 2))
        result["ensemble"] = {
            "critics": args.critics,
            "updates_per_s": many,
            "two_critics_updates_per_s": two,
            "ratio_vs_two": many / two,
        }
    if isinstance(updater, GraphedUpdate):
        result["cuda_graph"] = {"captured": updater.captured, "why_not": updater.failed}
    if on_gpu:
        best_eager = max(r["eager"] for r in rounds)
        result["eager"] = {"updates_per_s": best_eager, "samples_per_s": best_eager * batch_size}
        result["ratio_vs_eager"] = best_ours / best_eager
    if "replay" in steps:
        result["replay_only"] = {"updates_per_s": max(r["replay"] for r in rounds)}
    if "compiled" in steps:
        result["compiled"] = {
            "updates_per_s": max(r["compiled"] for r in rounds),
            "replay_only_updates_per_s": max(r["compiled_replay"] for r in rounds),
            "captured": compiled.captured,
        }
        if "lean_sac" in steps:
            best_lean = max(r["lean_sac"] for r in rounds)
            result["compiled"]["ratio_vs_lean_sac"] = result["compiled"]["updates_per_s"] / best_lean
    if "lean_sac" in steps:
        best_lean = max(r["lean_sac"] for r in rounds)
        result["lean_sac"] = {"updates_per_s": best_lean, "compiled": lean.compiled}
        result["ratio_vs_lean_sac"] = best_ours / best_lean
        best_plain_sac = max(r["plain_sac"] for r in rounds)
        result["ratio_lean_vs_plain_sac"] = best_lean / best_plain_sac
    if states:
        best_plain_sac = max(r["plain_sac"] for r in rounds)
        result["plain_sac"] = {"updates_per_s": best_plain_sac, "samples_per_s": best_plain_sac * batch_size}
        result["ratio_vs_plain_sac"] = best_ours / best_plain_sac
    print(
        f"{cfg.algo.type} / {cfg.policy.summary()} on {result['config']['device_name']}, batch {batch_size}, "
        f"actor {total / 1e6:.2f}M parameters ({trainable / 1e6:.2f}M trained): "
        f"{best_ours:.1f} updates/s ({best_ours * batch_size:,.0f} samples/s); plain step {best_raw:.1f}/s; "
        f"ratio ours/raw {result['ratio']:.2f}"
        + (f"; plain SAC loop {best_plain_sac:.1f}/s, ratio {result['ratio_vs_plain_sac']:.2f}" if states else "")
        + (f"; as written {best_eager:.1f}/s (graph {result['ratio_vs_eager']:.2f}x)" if on_gpu else "")
        + (f"; LeanRL-style {best_lean:.1f}/s, ratio {result['ratio_vs_lean_sac']:.2f}" if "lean_sac" in steps else "")
        + (
            f"; {args.critics} critics {many:.1f}/s vs 2 critics {two:.1f}/s, ratio {many / two:.2f}"
            if args.critics
            else ""
        )
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
