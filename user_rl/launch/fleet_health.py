"""Keeping the fleet running: an edge daemon whose process dies, whose loop raised, or whose
robot stops answering (one reset / step call longer than `fleet.stall_s`) is placed again by
Ray with the same robot and spool, so it rejoins under a new stream epoch and re-sends what was
not yet acknowledged. After `fleet.max_restarts` the robot is reported failed and the rest of
the fleet trains on. An edge still starting (a loaded box can take longer than any status timeout
to start a process and build a robot) reports each stage of its build and is waited for: only one
stuck in a stage for `fleet.start_timeout_s` is restarted, so no restart is spent on a slow start.

    fleet = FleetHealth(spawn, robot_ids, max_restarts=3, out=print)
    while training:
        fleet.poll()            # statuses of live edges; restarts and failures are printed
    final = fleet.finish()      # every robot's last status, failed ones with the reason
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

Printer = Callable[[str], None]
STATUS_TIMEOUT_S = 30.0  # a started edge that takes this long to answer a status call is gone
STATUS_WAIT_S = 1.0  # how long one poll waits for answers (the launch's loop goes on meanwhile)


class FleetHealth:
    """Starting is not hung: an edge that has not answered yet since it was placed (its process still
    starting), or that answers `starting` (building its robot, stage by stage), is waited for; only one
    that shows no progress for `start_timeout_s` is restarted. Once started, a status call unanswered
    for `status_timeout_s` means it is gone."""

    def __init__(
        self,
        spawn: Callable[[int], Any],
        robot_ids: list[str],
        max_restarts: int,
        out: Printer,
        stall_s: float = 30.0,
        start_timeout_s: float = 300.0,
        status_timeout_s: float | None = None,
    ) -> None:
        self.spawn = spawn
        self.robot_ids = list(robot_ids)
        self.max_restarts = max_restarts
        self.stall_s = stall_s
        self.start_timeout_s = start_timeout_s
        self.status_timeout_s = STATUS_TIMEOUT_S if status_timeout_s is None else status_timeout_s
        self.out = out
        self.restarts = {robot_id: 0 for robot_id in robot_ids}
        self.failed: dict[str, str] = {}
        self.last: dict[str, dict] = {}
        self.started: set[str] = set()
        self._asked: dict[str, tuple[Any, float]] = {}  # robot id -> (its status call in flight, when asked)
        self._progress_at: dict[str, tuple[Any, float]] = {}  # robot id -> (its last start-up stage, since when)
        self.edges: dict[str, Any] = {}
        for i, robot_id in enumerate(robot_ids):
            self._place(robot_id, i)

    @property
    def active(self) -> list[str]:
        return [robot_id for robot_id in self.robot_ids if robot_id not in self.failed]

    def wait_started(self) -> None:
        """Block until every edge has built its robot and daemon (or failed to)."""
        while any(robot_id not in self.started for robot_id in self.active):
            self.poll()
            time.sleep(0.2)

    def poll(self) -> dict[str, dict]:
        """The latest status of every live edge; restarts dead, unhealthy or hung ones on the way."""
        now = time.monotonic()
        for robot_id in self.active:
            if robot_id not in self._asked:
                self._asked[robot_id] = (self.edges[robot_id].status.remote(), now)
        refs = [ref for ref, _ in self._asked.values()]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=STATUS_WAIT_S)[0]) if refs else set()
        for robot_id in self.active:
            ref, asked_at = self._asked[robot_id]
            if ref not in ready:
                self._judge_silence(robot_id, asked_at)
                continue
            del self._asked[robot_id]
            try:
                status = ray.get(ref)
            except RayActorError as exc:
                self._restart(robot_id, f"its edge daemon is gone ({type(exc).__name__})")
                continue
            self._judge(robot_id, status)
        return {robot_id: self.last[robot_id] for robot_id in self.active if robot_id in self.last}

    def _judge_silence(self, robot_id: str, asked_at: float) -> None:
        """No answer yet: a started edge silent for status_timeout_s is gone; an edge that never answered
        (its process still starting: Ray placing it, Python importing) gets start_timeout_s."""
        now = time.monotonic()
        if robot_id in self.started:
            if now - asked_at > self.status_timeout_s:
                self._restart(robot_id, f"its edge daemon is gone (no status answer in {self.status_timeout_s:.0f} s)")
        elif now - self._progress_at[robot_id][1] > self.start_timeout_s:
            self._restart(robot_id, f"its edge process did not come up in {self.start_timeout_s:.0f} s")

    def _judge(self, robot_id: str, status: dict) -> None:
        if status.get("refused"):  # restarting cannot change the robot's spaces
            ray.kill(self.edges[robot_id], no_restart=True)
            self._fail(robot_id, f"the learner refused it: {status['refused']}")
        elif status.get("error"):
            lines = status["error"].strip().splitlines()
            self._restart(robot_id, f"unhealthy: {lines[-1] if lines else 'error'}")
        elif status.get("starting"):  # building its robot: progress is a new stage
            stage = status.get("stage")
            if stage != self._progress_at[robot_id][0]:
                self._progress_at[robot_id] = (stage, time.monotonic())
            if status.get("stage_s", 0.0) > self.start_timeout_s:
                self._restart(
                    robot_id,
                    f"stuck starting: {stage} for {status['stage_s']:.0f} s "
                    f"(fleet.start_timeout_s={self.start_timeout_s:g})",
                )
            else:
                self.last[robot_id] = status  # the fleet status shows what it is doing
        elif status.get("robot_unanswered_s", 0.0) > self.stall_s:
            self._restart(robot_id, f"the robot stopped answering ({status['robot_unanswered_s']:.0f} s in one call)")
        else:
            self.started.add(robot_id)
            self.last[robot_id] = status

    def report(self) -> dict[str, dict]:
        """Per robot: its last status, restarts, and why it failed (None while it runs)."""
        return {
            robot_id: {
                **self.last.get(robot_id, {}),
                "robot_id": robot_id,
                "restarts": self.restarts[robot_id],
                "failed": self.failed.get(robot_id),
            }
            for robot_id in self.robot_ids
        }

    def finish(self) -> list[dict]:
        """Stop every live edge (flushing its batches); failed robots keep their reason."""
        refs = {robot_id: self.edges[robot_id].finish.remote() for robot_id in self.active}
        for robot_id, ref in refs.items():
            try:
                self.last[robot_id] = ray.get(ref, timeout=120)
            except (RayActorError, GetTimeoutError) as exc:
                self._fail(robot_id, f"did not finish cleanly ({type(exc).__name__})")
        return list(self.report().values())

    def _place(self, robot_id: str, index: int) -> None:
        self.edges[robot_id] = self.spawn(index)
        self.started.discard(robot_id)
        self._asked.pop(robot_id, None)
        self._progress_at[robot_id] = (None, time.monotonic())

    def _restart(self, robot_id: str, why: str) -> None:
        ray.kill(self.edges[robot_id], no_restart=True)  # a hung process must not hold the robot
        self._asked.pop(robot_id, None)
        if self.restarts[robot_id] >= self.max_restarts:
            self._fail(robot_id, f"{why}; no restarts left (fleet.max_restarts={self.max_restarts})")
            return
        self.restarts[robot_id] += 1
        self.out(f"robot {robot_id}: {why}; restarting it ({self.restarts[robot_id]} of {self.max_restarts})")
        self._place(robot_id, self.robot_ids.index(robot_id))

    def _fail(self, robot_id: str, why: str) -> None:
        if robot_id not in self.failed:
            self.failed[robot_id] = why
            self.out(f"robot {robot_id} FAILED: {why}; the rest of the fleet trains on")
