"""The edge's tests share `running`: a real learner and edge daemons over loopback ZeroMQ."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from user_rl.cloud.learner import Learner
from user_rl.config import build_config
from user_rl.edge.daemon import EdgeDaemon
from user_rl.edge.factory import make_edge


@pytest.fixture
def running(tmp_path: Path):
    """Start a learner and edges for a config; stop everything afterwards. Each edge is built,
    run and closed in its own thread, as the edge service does (GL contexts are per thread)."""
    started: list = []

    def start(overrides: list[str], robot: dict) -> tuple[Learner, list[EdgeDaemon]]:
        cfg = build_config({"robot": robot}, overrides)
        learner = Learner(cfg, tmp_path)
        threading.Thread(target=learner.run, daemon=True).start()
        edges: list[EdgeDaemon] = []
        threads = []
        for i in range(cfg.fleet.num_robots):
            built = threading.Event()

            def serve(index: int = i, built: threading.Event = built) -> None:
                edge = make_edge(cfg, index, learner.addresses["data"], learner.addresses["weights"])
                edges.append(edge)
                built.set()
                try:
                    edge.run()
                finally:
                    edge.close()

            threads.append(threading.Thread(target=serve, daemon=True))
            threads[-1].start()
            assert built.wait(60)
        started.append((learner, edges, threads))
        return learner, edges

    yield start
    for learner, edges, threads in started:
        for edge in edges:
            edge.stop()
        for thread in threads:
            thread.join(timeout=10)
        learner.stop()
        time.sleep(0.3)
        learner.close()
