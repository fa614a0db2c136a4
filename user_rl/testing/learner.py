"""A learner, and edges at it, serving from threads of the test's own process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from user_rl.cloud.learner import Learner
from user_rl.config import Config
from user_rl.edge.daemon import EdgeDaemon


@contextmanager
def serving_learner(cfg: Config, run_dir: Path) -> Iterator[Learner]:
    """The learner runs on a daemon thread while the block runs; then it stops and closes."""
    learner = Learner(cfg, run_dir)
    thread = threading.Thread(target=learner.run, name="learner", daemon=True)
    thread.start()
    try:
        yield learner
    finally:
        learner.stop()
        thread.join(30)
        learner.close()


@contextmanager
def serving_edge(cfg: Config, index: int, learner: Learner, build_timeout_s: float = 60.0) -> Iterator[EdgeDaemon]:
    """Robot `index`'s edge daemon, talking to `learner`, while the block runs: built, run and closed
    on a thread of its own, as the edge service does (a renderer's GL context belongs to its thread)."""
    from user_rl.edge.factory import make_edge

    built, edges, failed = threading.Event(), [], []

    def serve() -> None:
        try:
            edges.append(make_edge(cfg, index, learner.addresses["data"], learner.addresses["weights"]))
        except BaseException as exc:
            failed.append(exc)
            raise
        finally:
            built.set()
        try:
            edges[0].run()
        finally:
            edges[0].close()

    thread = threading.Thread(target=serve, name=f"edge-{index}", daemon=True)
    thread.start()
    if not built.wait(build_timeout_s):
        raise TimeoutError(f"edge {index} was not built within {build_timeout_s:g} s")
    if failed:
        raise RuntimeError(f"edge {index} could not be built: {failed[0]!r}") from failed[0]
    try:
        yield edges[0]
    finally:
        edges[0].stop()
        thread.join(30)
