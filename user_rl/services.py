"""Long-running components wrapped for placement: each runs its loop in a thread and answers
status / control calls from the process that placed it (a Ray actor, or a test).
"""

from __future__ import annotations

import abc
import logging
import os
import threading
import time
import traceback
from typing import Any

from user_rl.config import Config


def _quiet_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("USER_RL_LOG_LEVEL", "WARNING"), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )


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
    """The learner in a thread. After a full disk (its buffer stops taking data and says why in its
    status), the first status call that finds room again stops it, and its thread starts it again on
    its buffer and addresses, as the standalone learner does (`cloud.standalone.reopened`)."""

    def __init__(self, cfg: dict[str, Any], run_dir: str) -> None:
        _quiet_logging()
        from user_rl.cloud.learner import Learner

        self.learner = Learner(Config.model_validate(cfg), run_dir)
        self._finishing = False
        self._restarting = False
        self._start_thread("learner")

    def _loop(self) -> None:
        from user_rl.cloud.standalone import reopened

        while True:
            self.learner.run()  # returns once stopped: by finish(), or by status() when a full disk has room
            if self._finishing:
                return
            reason = self.learner.status().get("failure")
            self.learner = reopened(self.learner)
            self._restarting = False
            logging.getLogger(__name__).warning(
                "the disk has room again: learner restarted on its buffer (was: %s)", reason
            )

    def addresses(self) -> dict[str, str]:
        return self.learner.addresses

    def device(self) -> str:
        """Where the learner trains, e.g. "cpu" or "cuda:0 (NVIDIA H100)"."""
        return self.learner.device_name

    def status(self) -> dict:
        from user_rl.cloud.standalone import room_for

        learner = self.learner
        status = learner.status()
        if not (self._restarting or self._finishing) and room_for(learner, status):
            self._restarting = True
            learner.stop()  # `_loop` starts it again on its buffer
        return {**status, "error": self.error, "pid": os.getpid(), "restarting": self._restarting}

    def pause(self) -> int:
        return self.learner.pause()

    def updates(self) -> int:
        """Updates made so far, read now (the status is made twice a second)."""
        return self.learner.updates

    def set_active_robots(self, count: int) -> None:
        self.learner.set_active_robots(count)

    def set_hold(self, env_steps: int | None) -> None:
        """The next evaluation point, where a paced fleet and the updates stop (None: none)."""
        self.learner.set_hold(env_steps)

    def resume(self) -> None:
        self.learner.resume()

    def finish(self) -> dict:
        """Stop the loop, write the final checkpoint, return the final status."""
        self._finishing = True
        deadline = time.monotonic() + 60
        while self.thread.is_alive() and time.monotonic() < deadline:
            self.learner.stop()  # the current one: a restart may have replaced it meanwhile
            self.thread.join(timeout=0.5)
        path = self.learner.save()
        status = self.status()
        self.learner.close()
        return {**status, "checkpoint": str(path) if path else None}


class EdgeService(_Threaded):
    """Builds, runs and closes the edge daemon in one thread (the robot's GL context lives there).

    The constructor returns at once and the build goes on in that thread, so `status()` answers while
    the edge starts (a loaded box can take longer than any status timeout to import and build a robot):
    `starting` with the stage it is at and for how long, which tells a slow start from a hung one."""

    def __init__(
        self, cfg: dict[str, Any], index: int, addresses: dict[str, str], spool_root: str | None = None
    ) -> None:
        _quiet_logging()
        self.cfg, self.index, self.addresses = Config.model_validate(cfg), index, addresses
        self.spool_root = spool_root
        self.daemon = None
        self.stage, self._stage_since = "starting", time.monotonic()
        self._finishing = threading.Event()
        self._start_thread(f"edge-{index}")

    def _progress(self, stage: str) -> None:
        """The build reached `stage` (what it is doing now)."""
        self.stage, self._stage_since = stage, time.monotonic()

    def _loop(self) -> None:
        from user_rl.edge.factory import make_edge

        self.daemon = make_edge(
            self.cfg,
            self.index,
            self.addresses["data"],
            self.addresses["weights"],
            self.spool_root,
            progress=self._progress,
        )
        if self._finishing.is_set():  # finished while it was starting
            self.daemon.close()
            return
        try:
            self.daemon.run()
        finally:
            self.daemon.close()

    def status(self) -> dict:
        if self.daemon is None:
            base = {
                "robot_id": self.cfg.robot_options(self.index)["robot_id"],
                "starting": self.error is None,
                "stage": self.stage,
                "stage_s": round(time.monotonic() - self._stage_since, 1),
            }
        else:
            base = self.daemon.status()
        return {**base, "error": self.error, "pid": os.getpid()}

    def finish(self) -> dict:
        self._finishing.set()
        if self.daemon is not None:
            self.daemon.stop()
        self.thread.join(timeout=30)
        return self.status()
