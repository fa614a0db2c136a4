"""Shared by the end-to-end tests: `user-rl train` / `user-rl eval` as a user runs them; for the chaos
tests a standalone `user-rl learner` process to SIGKILL and restart, edge daemons in threads, and
the buffer's own index as the judge of what arrived."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

from tests.support.cli import REPO, user_rl
from user_rl.cloud.buffer.index import BufferIndex
from user_rl.edge.factory import make_edge
from user_rl.testing.wait import wait_until


class EdgeThreads:
    """Edge daemons, each built, run and closed in its own thread (as the edge service does)."""

    def __init__(self, cfg, data: str, weights: str, spool_root: Path) -> None:
        self.edges, self.threads = [], []
        for i in range(cfg.fleet.num_robots):
            built = threading.Event()

            def serve(index: int = i, built: threading.Event = built) -> None:
                edge = make_edge(cfg, index, data, weights, spool_root)
                self.edges.append(edge)
                built.set()
                try:
                    edge.run()
                    edge.drain(120)
                finally:
                    edge.close()

            self.threads.append(threading.Thread(target=serve, daemon=True))
            self.threads[-1].start()
            assert built.wait(60)

    def produced(self) -> set[tuple[str, int, int]]:
        return {(e.link.robot_id, e.link.epoch, seq) for e in self.edges for seq in range(1, e.link.seq + 1)}

    def stop_and_drain(self) -> None:
        for edge in self.edges:
            edge.stop()
        for thread in self.threads:
            thread.join(150)
        assert all(e.link.unacked == 0 for e in self.edges), [e.status() for e in self.edges]


def stored(run_dir: Path) -> tuple[list[tuple[str, int, int]], int]:
    """Every (robot, epoch, seq) in the closed buffer (duplicates would repeat) and its records."""
    index = BufferIndex(run_dir / "buffer" / "index.sqlite", read_only=True)
    try:
        return index.batch_keys(), sum(s.records for s in index.segments(status=None))
    finally:
        index.close()


def start_learner(config: Path, run_dir: Path, log) -> subprocess.Popen:
    proc = subprocess.Popen(
        user_rl("learner", str(config), "--run-dir", str(run_dir)),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    status = run_dir / "learner_status.json"
    wait_until(
        lambda: status.exists() and json.loads(status.read_text()).get("pid") == proc.pid, 60, "the learner to come up"
    )
    return proc


def learner_status(run_dir: Path) -> dict:
    return json.loads((run_dir / "learner_status.json").read_text())


# An edge in its own process (to SIGKILL): prints its epoch, runs, drains, prints what it did.
EDGE_SCRIPT = """
import sys, yaml
from user_rl.config import build_config
from user_rl.edge.factory import make_edge
cfg = build_config(yaml.safe_load(open(sys.argv[1])))
edge = make_edge(cfg, 0, sys.argv[2], sys.argv[3], sys.argv[4])
print("epoch", edge.link.epoch, flush=True)
edge.run(max_steps=int(sys.argv[5]))
edge.drain(60)
print("done", edge.steps, edge.link.seq, flush=True)
"""


def run_cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        user_rl(*args),
        cwd=REPO,
        env={**os.environ, "MUJOCO_GL": "egl"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def train(config: str, run_root: Path, *overrides: str, timeout: float = 900, learning: bool = False) -> dict:
    """`user-rl train` to its end; its summary. `learning`: a learning demonstration, judged by what it
    learned in its env steps, not by this machine's speed: its run may go on until shortly before
    `timeout` (a config's `stop.max_wall_s` is for people's runs; a loaded box stopped one early)."""
    if learning:
        overrides = (f"stop.max_wall_s={int(timeout) - 90}", *overrides)
    proc = run_cli("train", config, f"run_root={run_root}", *overrides, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (summary_path,) = run_root.glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    summary["stdout"] = proc.stdout
    return summary


def evaluate(checkpoint: str, episodes: int, seed: int, *overrides: str) -> dict:
    proc = run_cli(
        "eval", checkpoint, *overrides, "--episodes", str(episodes), "--seed", str(seed), "--json", timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# These runs are judged on fresh episodes after they end: evaluations on the way (the learning
# curve every run draws) would only cost the suite time.
ONLY_THE_FINAL_EVALUATION = ("stop.eval_every_s=null",)
