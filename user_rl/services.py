"""Long-running components wrapped for placement: each runs its loop in a thread and answers
status / control calls from the process that placed it (a Ray actor, or a test).
"""

from __future__ import annotations

import abc
import logging
import os
import threading
import traceback
from typing import Any

from user_rl.config import Config


def _quiet_logging() -> None:
    logging.basicConfig(level=os.environ.get("USER_RL_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


class _Threaded(abc.ABC):
    """Runs `self._loop()` in a daemon thread and keeps any crash for `status()` to report."""

    def _start_thread(self, name: str) -> None:
        self.error: str | None = None
        self.thread = threading.Thread(target=self._guarded, name=name, daemon=True)
        self.thread.start()

    def _guarded(self) -> None:
        try:
            self._loop()
        except Exception:  # reported to the driver, which stops the run with this message
            self.error = traceback.format_exc()

    @abc.abstractmethod
    def _loop(self) -> None:
        """The component's main loop; returns when the component stops."""


class LearnerService(_Threaded):
    def __init__(self, cfg: dict[str, Any], run_dir: str) -> None:
        _quiet_logging()
        from user_rl.cloud.learner import Learner

        self.learner = Learner(Config.model_validate(cfg), run_dir)
        self._start_thread("learner")

    def _loop(self) -> None:
        self.learner.run()

    def addresses(self) -> dict[str, str]:
        return self.learner.addresses

    def device(self) -> str:
        """Where the learner trains, e.g. "cpu" or "cuda:0 (NVIDIA H100)"."""
        return self.learner.device_name

    def status(self) -> dict:
        return {**self.learner.status(), "error": self.error, "pid": os.getpid()}

    def pause(self) -> int:
        return self.learner.pause()

    def set_active_robots(self, count: int) -> None:
        self.learner.active_robots = count

    def set_hold(self, env_steps: int | None) -> None:
        """The next evaluation point, where a paced fleet and the updates stop (None: none)."""
        self.learner.hold_at = env_steps

    def resume(self) -> None:
        self.learner.resume()

    def finish(self) -> dict:
        """Stop the loop, write the final checkpoint, return the final status."""
        self.learner.stop()
        self.thread.join(timeout=60)
        path = self.learner.save()
        status = self.status()
        self.learner.close()
        return {**status, "checkpoint": str(path) if path else None}


class EdgeService(_Threaded):
    """Builds, runs and closes the edge daemon in one thread (the robot's GL context lives there)."""

    def __init__(self, cfg: dict[str, Any], index: int, addresses: dict[str, str], spool_root: str | None = None) -> None:
        _quiet_logging()
        self.cfg, self.index, self.addresses = Config.model_validate(cfg), index, addresses
        self.spool_root = spool_root
        self.daemon = None
        self._built = threading.Event()
        self._start_thread(f"edge-{index}")
        self._built.wait(timeout=120)

    def _loop(self) -> None:
        from user_rl.edge.factory import make_edge

        try:
            self.daemon = make_edge(self.cfg, self.index, self.addresses["data"], self.addresses["weights"],
                                    self.spool_root)
        finally:
            self._built.set()
        try:
            self.daemon.run()
        finally:
            self.daemon.close()

    def status(self) -> dict:
        base = self.daemon.status() if self.daemon else {"robot_id": f"edge-{self.index}"}
        return {**base, "error": self.error, "pid": os.getpid()}

    def finish(self) -> dict:
        if self.daemon is not None:
            self.daemon.stop()
        self.thread.join(timeout=30)
        return self.status()
