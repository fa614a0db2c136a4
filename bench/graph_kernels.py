"""Where a graphed update's device time goes: SAC's CUDA graph replayed alone, and its kernels, against LeanSAC's.

`bench/gpu_updates.py` times the trainer's whole path (the batch copied up, the graph replayed). This
times the replay alone (the batch already in the graph's inputs: no copy, no host work), so what is
left is the device's time per update, and counts the kernels one update launches with PyTorch's
profiler (stepped without the graph), for: our SAC captured as written, compiled with Adam's fused
kernel, compiled with the foreach Adam that `torch.compile` turns into kernels of its own (what
`learner.compile` uses), and the LeanRL-style reference (`bench/lean_sac.py`), in one process.

    python bench/graph_kernels.py [--hidden 128 128] [--out FILE]     # needs a CUDA GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]
from lean_sac import LeanSAC  # noqa: E402
from policy_updates import buffer_batch  # noqa: E402

from user_rl.algos import make_algo  # noqa: E402
from user_rl.algos.graphed import GraphedUpdate, capturable, training_batch  # noqa: E402
from user_rl.cloud.batches import training_columns  # noqa: E402
from user_rl.hal.registry import robot_spaces  # noqa: E402


def replay_rate(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return replays / (time.perf_counter() - started)


def kernels(step) -> dict:
    """The CUDA kernels one call of `step` launches, and their device time (µs)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    launched = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"kernels": len(launched), "device_us": round(sum(e.device_time for e in launched), 1)}


def ours(hidden: list[int], compile: bool, fused: bool, replays: int) -> dict:
    device = torch.device("cuda")
    obs_space, action_space = robot_spaces("mujoco_reach", {"obs_mode": "state"})
    torch.manual_seed(0)
    algo = make_algo("sac", obs_space, action_space, "mlp", {"hidden": hidden}, None, device)
    graphed = GraphedUpdate(algo, device, compile=compile)
    capturable(algo, fused=fused)
    batch = buffer_batch(obs_space, action_space, 256, 1, 1, np.random.default_rng(0))
    columns = {k: torch.from_numpy(v) for k, v in training_columns(batch, algo.batch_columns).items()}
    started = time.perf_counter()
    for _ in range(5):
        graphed(columns)
    torch.cuda.synchronize()
    found = {"setup_s": round(time.perf_counter() - started, 1), "captured": graphed.captured}
    if graphed.captured:
        on_device = training_batch(columns, device)
        found |= {"replay_per_s": replay_rate(graphed.graph, replays), **kernels(lambda: graphed.step(on_device))}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    parser.add_argument("--replays", type=int, default=600)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/graph_kernels.py needs a CUDA GPU")
    results = {}
    for name, compile, fused in (
        ("graph", False, True),
        ("compiled_fused_adam", True, True),
        ("compiled", True, False),
    ):
        results[name] = ours(args.hidden, compile, fused, args.replays)
        print(name, results[name], flush=True)
    device = torch.device("cuda")
    obs_space, action_space = robot_spaces("mujoco_reach", {"obs_mode": "state"})
    obs_dim, action_dim = obs_space["state"].shape[0], action_space.shape[0]
    lean = LeanSAC(obs_dim, action_dim, args.hidden, device)
    rows = 256
    batch = [torch.randn(rows, obs_dim, device=device), torch.rand(rows, action_dim, device=device) * 2 - 1]
    batch += [torch.randn(rows, device=device), torch.randn(rows, obs_dim, device=device)]
    batch.append(torch.zeros(rows, device=device))
    for _ in range(5):
        lean.update(*batch)
    results["lean_sac"] = {"replay_per_s": replay_rate(lean.graph, args.replays), **kernels(lambda: lean.step(*batch))}
    print("lean_sac", results["lean_sac"], flush=True)
    for name in ("graph", "compiled_fused_adam", "compiled"):
        if "replay_per_s" in results[name]:
            results[name]["ratio_vs_lean_sac"] = results[name]["replay_per_s"] / results["lean_sac"]["replay_per_s"]
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
