"""What an edge tells the learner about its robot's health, for the fleet table (`user-rl status`).

`health` is "ok" or what is wrong now, worst first: an e-stop, a learner that refused the robot,
the robot's own health probe. `last_error` is the newest problem any part met (the robot's probe, a
refused message, a failed hold, a weight receiver that failed, a link whose handshake fails): it
stays shown after the problem went away, so an operator who looks later still sees what happened.
"""

from __future__ import annotations

from collections.abc import Callable

from user_rl.hal.robot import Robot

Problem = Callable[[], str | None]  # what is wrong with one part now (None: nothing)
MAX_CHARS = 300


class EdgeHealth:
    def __init__(self, robot: Robot, estopped: Problem, refused: Problem, problems: dict[str, Problem]) -> None:
        self.robot = robot
        self.estopped = estopped
        self.refused = refused
        self.problems = {"robot": self._probe, **problems}
        self._seen: dict[str, str | None] = {name: None for name in self.problems}
        self._probed: str | None = None
        self.last_error = ""

    def check(self) -> tuple[str, str]:
        """(health, last error), once a heartbeat on the control loop: probes the robot once."""
        try:
            probe = self.robot.health()
            self._probed = None if probe.ok else (probe.detail or "not ok")
        except Exception as exc:  # noqa: BLE001 - a probe that raises says the robot is not well
            self._probed = f"health probe failed: {exc!r}"
        for name, source in self.problems.items():
            now = source()
            if now and now != self._seen[name]:
                self.last_error = f"{name}: {now}"[:MAX_CHARS]
            self._seen[name] = now
        return self._health()[:MAX_CHARS], self.last_error

    def _health(self) -> str:
        if reason := self.estopped():
            return f"estopped: {reason}"
        if reason := self.refused():
            return f"refused: {reason}"
        return f"unhealthy: {self._probed}" if self._probed else "ok"

    def _probe(self) -> str | None:
        return self._probed
