"""A critic ensemble's forward and backward: stacked (ours, `QEnsemble`) against separate networks.

Raw baseline, in the same run: E separate `nn.Sequential`s (what `TwinQCritic` was: one per member,
called in a Python loop), the same input, the same loss (each member's MSE to one target, summed),
forward and backward. Also measured: the same members through `torch.func.vmap` of
`functional_call` over their stacked parameters, the other way to vectorise them. The ratio
ours/separate (in passes per second) at E=2 says whether two critics got slower, at E=10 what
an RLPD-size ensemble gains. No optimiser step: that is `bench/policy_updates.py`'s whole update.

With `--no-grad` each case is a forward pass without gradients (a target, QC's best-of-N pick),
and `ours` is `QEnsemble.q_of`, which on a CPU then runs member by member on views of the stacked
weights instead of the stacked form.

    python bench/critic_ensemble.py [--batch 256] [--hidden 256 256] [--critics 2 10] [--threads 1] [--no-grad]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from user_rl.policies.encoders import mlp  # noqa: E402
from user_rl.policies.ensemble import QEnsemble  # noqa: E402


def best_rates(steps: dict[str, Callable[[], torch.Tensor]], rounds: int, burst: int) -> dict[str, float]:
    """Passes per second of each step: short bursts, the steps taking turns, the best burst of each
    counting (a machine busy with other work slows some bursts, never speeds one up)."""
    best = dict.fromkeys(steps, 0.0)
    for step in steps.values():  # warm-up: allocator, autograd graph
        step()
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(burst):
                step()
            best[name] = max(best[name], burst / (time.perf_counter() - start))
    return best


def cases(
    critics: int, batch: int, in_dim: int, hidden: list[int], layer_norm: bool, grad: bool = True
) -> dict[str, Callable]:
    """The ways to run `critics` members of one shape, each a forward+backward step on the same input
    (with `grad` false, a forward pass without gradients, and `ours`: what `QEnsemble.q_of` does then)."""
    torch.manual_seed(0)
    x, target = torch.randn(batch, in_dim), torch.randn(batch, 1)
    obs_space = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (in_dim - 1,), np.float32)})
    ours = QEnsemble(obs_space, gym.spaces.Box(-1, 1, (1,), np.float32), hidden, layer_norm, critics)
    separate = [mlp(in_dim, hidden, 1, layer_norm) for _ in range(critics)]
    params, buffers = stack_module_state(copy.deepcopy(separate))
    shape = copy.deepcopy(separate[0]).to("meta")

    def member(p: dict, b: dict, inputs: torch.Tensor) -> torch.Tensor:
        return functional_call(shape, (p, b), (inputs,))

    vmapped = vmap(member, in_dims=(0, 0, None))

    def loss_of(qs: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(qs, target.expand_as(qs), reduction="none").mean(dim=(1, 2)).sum()

    def step(loss: torch.Tensor) -> torch.Tensor:
        loss.backward()
        return loss.detach()

    if not grad:
        forward = torch.no_grad()
        return {
            "stacked": forward(lambda: ours.qs(x.expand(critics, *x.shape))),
            "ours": forward(lambda: ours.q_of(x[:, :-1], x[:, -1:])),
            "separate": forward(lambda: torch.stack([q(x) for q in separate])),
            "vmap": forward(lambda: vmapped(params, buffers, x)),
        }
    return {
        "stacked": lambda: step(loss_of(ours.qs(x.expand(critics, *x.shape)))),
        "separate": lambda: step(sum(F.mse_loss(q(x), target) for q in separate)),
        "vmap": lambda: step(loss_of(vmapped(params, buffers, x))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--in-dim", type=int, default=24, help="observation features + action")
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--critics", type=int, nargs="+", default=[2, 10])
    parser.add_argument("--layer-norm", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-grad", action="store_true", help="forward passes without gradients (a target)")
    parser.add_argument("--rounds", type=int, default=40, help="bursts of each case, taking turns")
    parser.add_argument("--burst", type=int, default=5, help="passes per burst")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result: dict = {"config": {**vars(args), "torch": torch.__version__}, "critics": {}}
    for count in args.critics:
        steps = cases(count, args.batch, args.in_dim, args.hidden, args.layer_norm, grad=not args.no_grad)
        best = best_rates(steps, args.rounds, args.burst)
        ratios = {f"{name}_vs_separate": rate / best["separate"] for name, rate in best.items() if name != "separate"}
        result["critics"][count] = {"passes_per_s": best, **ratios}
        print(
            f"E={count}, batch {args.batch}, hidden {args.hidden}, {args.threads} thread(s), "
            f"{'forward without gradients' if args.no_grad else 'forward and backward'}: "
            + ", ".join(f"{name} {rate:.0f}/s" for name, rate in best.items())
            + "; "
            + ", ".join(f"{name.replace('_vs_', '/')} {ratio:.2f}" for name, ratio in ratios.items())
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
