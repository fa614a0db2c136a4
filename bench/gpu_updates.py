"""The learner's update rates on a GPU: each policy below through `bench/policy_updates.py` on CUDA.

One table for a GPU box, from small to large: SAC with the state MLP (the 256-wide one also with a
ten-critic ensemble against two: `policy_updates.py --critics 10`), DrQ from 84x84 pixels, the tiny
VLA with action chunks, and a 100M-parameter VLA with its backbone frozen and trained whole. Each row
is ours (the trainer's work per update: training columns, the copy to the device, `algo.update`)
against a plain PyTorch step of the same encoder on the same device, measured in the same process
(`bench/policy_updates.py` says what each side does).

    python bench/gpu_updates.py                 # needs a CUDA GPU; writes bench/results/gpu_updates.json
    python bench/gpu_updates.py --quick         # a few updates of each, for a smoke check

`bench/run_all.py` runs it where CUDA is available, and elsewhere shows the rows of its last JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
# (name, config, overrides, batch, timed updates per round): what a lab trains, from a state MLP to a VLA
CASES: list[tuple[str, str, list[str], int, int]] = [
    ("sac_mlp_128", "configs/reach.yaml", ["--compile"], 256, 600),  # also torch.compile'd
    ("sac_mlp_256", "configs/reach.yaml", ["policy.hidden=[256,256]", "--critics", "10"], 256, 600),  # and 10 critics
    ("drq_pixels", "configs/reach_pixels.yaml", [], 256, 300),
    ("qc_flow", "configs/reach_flow_qc.yaml", [], 256, 300),
    ("dsrl_flow", "configs/reach_dsrl.yaml", [], 256, 300),
    ("residual_flow", "configs/reach_residual.yaml", [], 256, 300),
    ("vla_tiny", "configs/reach_vla.yaml", [], 128, 200),
    ("vla_100m_frozen", "configs/reach_vla.yaml", ["policy.size=100m", "policy.freeze=[encoder]"], 64, 50),
    ("vla_100m", "configs/reach_vla.yaml", ["policy.size=100m"], 64, 50),
]


def run_case(config: str, overrides: list[str], batch: int, updates: int, quick: bool, work: Path) -> dict:
    """One `policy_updates.py` run on cuda in its own process (a fresh CUDA context each)."""
    out = work / "case.json"
    out.unlink(missing_ok=True)
    command = [
        sys.executable,
        str(BENCH / "policy_updates.py"),
        config,
        *overrides,
        "--device",
        "cuda",
        "--out",
        str(out),
        "--batch",
        str(batch),
        *(["--quick"] if quick else ["--updates", str(updates), "--rounds", "3"]),
    ]
    done = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")},
    )
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"{' '.join(command[1:])} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    print(done.stdout.strip().splitlines()[-1], flush=True)
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few updates of each")
    parser.add_argument("--only", nargs="+", choices=[name for name, *_ in CASES], help="these cases only")
    parser.add_argument("--out", type=Path, default=BENCH / "results/gpu_updates.json")
    args = parser.parse_args()
    import torch  # here, not at the top: --help needs no torch

    if not torch.cuda.is_available():
        print(
            "bench/gpu_updates.py needs a CUDA GPU and torch.cuda.is_available() is False here; "
            "bench/policy_updates.py CONFIG --device cpu measures the CPU",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for name, config, overrides, batch, updates in CASES:
            if args.only is None or name in args.only:
                results[name] = run_case(config, overrides, batch, updates, args.quick, Path(work))
                # written after each case: a run cut short keeps what it measured
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(
                    json.dumps({"cases": results, "wall_s": round(time.monotonic() - started, 1)}, indent=2)
                )
    print(f"{len(results)} cases in {time.monotonic() - started:.0f} s; {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
