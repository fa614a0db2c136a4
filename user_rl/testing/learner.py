"""A learner serving from a thread of the test's own process, for tests that drive edges at it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from user_rl.cloud.learner import Learner
from user_rl.config import Config


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
