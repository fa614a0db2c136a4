"""The edge's tests share `running`: a real learner and edge daemons over loopback ZeroMQ."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest

from user_rl.cloud.learner import Learner
from user_rl.config import build_config
from user_rl.edge.daemon import EdgeDaemon
from user_rl.testing.learner import serving_edge


@pytest.fixture
def running(tmp_path: Path):
    """Start a learner and edges for a config; stop everything afterwards. Each edge is built,
    run and closed in its own thread, as the edge service does (GL contexts are per thread)."""
    started: list = []

    def start(
        overrides: list[str], robot: dict | None = None, base: dict | None = None
    ) -> tuple[Learner, list[EdgeDaemon]]:
        """`overrides` on `base` (a config file's tree; none: defaults), with `robot` when given."""
        cfg = build_config({**(base or {}), **({"robot": robot} if robot else {})}, overrides)
        learner = Learner(cfg, tmp_path)
        threading.Thread(target=learner.run, daemon=True).start()
        serving = contextlib.ExitStack()
        started.append((learner, serving))  # first: edges built before one that fails are stopped too
        edges = [serving.enter_context(serving_edge(cfg, i, learner)) for i in range(cfg.fleet.num_robots)]
        return learner, edges

    yield start
    for learner, serving in started:
        serving.close()  # the edges stop first
        learner.stop()
        time.sleep(0.3)
        learner.close()
