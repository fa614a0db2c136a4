"""Keeping the fleet running: an edge daemon whose process dies, whose loop raised, or whose
robot stops answering (one reset / step call longer than `fleet.stall_s`) is placed again by
Ray with the same robot and spool, so it rejoins under a new stream epoch and re-sends what was
not yet acknowledged. After `fleet.max_restarts` the robot is reported failed and the rest of
the fleet trains on.

    fleet = FleetHealth(spawn, robot_ids, max_restarts=3, out=print)
    while training:
        fleet.poll()            # statuses of live edges; restarts and failures are printed
    final = fleet.finish()      # every robot's last status, failed ones with the reason
"""

from __future__ import annotations

from typing import Any, Callable

import ray
from ray.exceptions import GetTimeoutError, RayActorError

Printer = Callable[[str], None]
STATUS_TIMEOUT_S = 30.0  # a fresh edge connects to its robot before it answers


class FleetHealth:
    def __init__(self, spawn: Callable[[int], Any], robot_ids: list[str], max_restarts: int, out: Printer,
                 stall_s: float = 30.0) -> None:
        self.spawn = spawn
        self.robot_ids = list(robot_ids)
        self.edges = {robot_id: spawn(i) for i, robot_id in enumerate(robot_ids)}
        self.max_restarts = max_restarts
        self.stall_s = stall_s
        self.out = out
        self.restarts = {robot_id: 0 for robot_id in robot_ids}
        self.failed: dict[str, str] = {}
        self.last: dict[str, dict] = {}

    @property
    def active(self) -> list[str]:
        return [robot_id for robot_id in self.robot_ids if robot_id not in self.failed]

    def wait_started(self) -> None:
        """Block until every edge has built its robot and daemon (or failed to)."""
        self.poll()

    def poll(self) -> dict[str, dict]:
        """The latest status of every live edge; restarts dead or unhealthy ones on the way."""
        refs = {robot_id: self.edges[robot_id].status.remote() for robot_id in self.active}
        for robot_id, ref in refs.items():
            try:
                status = ray.get(ref, timeout=STATUS_TIMEOUT_S)
            except (RayActorError, GetTimeoutError) as exc:
                self._restart(robot_id, f"its edge daemon is gone ({type(exc).__name__})")
                continue
            if status.get("refused"):  # restarting cannot change the robot's spaces
                ray.kill(self.edges[robot_id], no_restart=True)
                self._fail(robot_id, f"the learner refused it: {status['refused']}")
                continue
            if status.get("error"):
                lines = status["error"].strip().splitlines()
                self._restart(robot_id, f"unhealthy: {lines[-1] if lines else 'error'}")
                continue
            if status.get("robot_unanswered_s", 0.0) > self.stall_s:
                self._restart(robot_id, f"the robot stopped answering ({status['robot_unanswered_s']:.0f} s in one call)")
                continue
            self.last[robot_id] = status
        return {robot_id: self.last[robot_id] for robot_id in self.active if robot_id in self.last}

    def report(self) -> dict[str, dict]:
        """Per robot: its last status, restarts, and why it failed (None while it runs)."""
        return {robot_id: {**self.last.get(robot_id, {}), "robot_id": robot_id, "restarts": self.restarts[robot_id],
                           "failed": self.failed.get(robot_id)} for robot_id in self.robot_ids}

    def finish(self) -> list[dict]:
        """Stop every live edge (flushing its batches); failed robots keep their reason."""
        refs = {robot_id: self.edges[robot_id].finish.remote() for robot_id in self.active}
        for robot_id, ref in refs.items():
            try:
                self.last[robot_id] = ray.get(ref, timeout=120)
            except (RayActorError, GetTimeoutError) as exc:
                self._fail(robot_id, f"did not finish cleanly ({type(exc).__name__})")
        return list(self.report().values())

    def _restart(self, robot_id: str, why: str) -> None:
        ray.kill(self.edges[robot_id], no_restart=True)  # a hung process must not hold the robot
        if self.restarts[robot_id] >= self.max_restarts:
            self._fail(robot_id, f"{why}; no restarts left (fleet.max_restarts={self.max_restarts})")
            return
        self.restarts[robot_id] += 1
        self.out(f"robot {robot_id}: {why}; restarting it ({self.restarts[robot_id]} of {self.max_restarts})")
        self.edges[robot_id] = self.spawn(self.robot_ids.index(robot_id))

    def _fail(self, robot_id: str, why: str) -> None:
        if robot_id not in self.failed:
            self.failed[robot_id] = why
            self.out(f"robot {robot_id} FAILED: {why}; the rest of the fleet trains on")
