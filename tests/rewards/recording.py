"""Rewards tests record real runs: a learner and an edge over loopback ZeroMQ, into a real buffer."""

from __future__ import annotations

import threading
from pathlib import Path

from user_rl.cloud.learner import Learner
from user_rl.config import build_config
from user_rl.edge.factory import make_edge


def record_run(run_dir: Path, robot: dict, overrides: list[str], steps: int) -> Path:
    """One edge steps `steps` times with a real learner, delivers everything, and both stop cleanly
    (the buffer's segments sealed): `run_dir` is then a finished run's directory."""
    cfg = build_config({"robot": robot}, ["fleet.num_robots=1", "fleet.pace_to_learner=false", *overrides])
    learner = Learner(cfg, run_dir)
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    edge = make_edge(cfg, 0, learner.addresses["data"], learner.addresses["weights"])
    try:
        edge.run(max_steps=steps)
        assert edge.detach(60), "the edge could not deliver its steps"
    finally:
        edge.close()
        learner.stop()
        thread.join(30)
        learner.close()
    return run_dir
