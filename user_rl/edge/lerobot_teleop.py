"""Any LeRobot `Teleoperator` (a leader arm, a gamepad, a keyboard) as an intervention source.

    intervention:
      teleoperator: {type: so101_leader, port: /dev/ttyACM1, id: my_leader}   # LeRobot's own config
      teleoperator_drives: auto   # events | always

Who drives: a teleoperator with LeRobot's teleop events (gamepad, keyboard_ee) takes over while
its intervention event is on (`TeleopEvents.IS_INTERVENTION`, e.g. the gamepad's RB held); one
without events (a leader arm) drives on every step it is asked ("always"), as it does in
`lerobot-record`. Its other events become the operator requests a person makes at the teleop
page, taken once per press: success and failure label the episode (which ends it), terminate
ends it as a failure, and re-record ends it with the discard mark.

The teleoperator's scalar action features must name the robot's actions (a LeRobot robot's
`action_names`); for any other robot they are taken in order and must be as many. They are in the
robot's own terms: a leader arm's `<motor>.pos` are absolute goals for a follower's, so a take-over
away from the follower's pose is followed at the safety filter's per-step limit from the current
pose (for an absolute robot, on by default: docs/safety.md), not in one jump.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from user_rl.edge.intervention import StepView
from user_rl.edge.operator import OperatorRequests
from user_rl.hal.lerobot.devices import connect_device, float_names
from user_rl.hal.robot import Robot
from user_rl.wire import user_rl_pb2 as pb

Drives = Literal["auto", "events", "always"]
INTERVENTION, SUCCESS, FAILURE, TERMINATE, RERECORD = (
    "is_intervention",
    "success",
    "failure",
    "terminate_episode",
    "rerecord_episode",
)  # TeleopEvents values


class LeRobotTeleop:
    """An `InterventionSource` backed by a connected LeRobot teleoperator; a person's steps."""

    actor = pb.ACTOR_HUMAN

    def __init__(
        self,
        teleoperator: dict[str, Any],
        robot: Robot,
        requests: OperatorRequests,
        drives: Drives = "auto",
        calibrate: bool = False,
    ) -> None:
        self.device = connect_device("teleoperator", teleoperator, calibrate=calibrate)
        self.name = f"lerobot:{teleoperator['type']}"
        self.requests = requests
        self.low, self.high = robot.action_space.low, robot.action_space.high
        try:
            self.names = _action_names(float_names(self.device.action_features, f"teleoperator {self.name}"), robot)
        except BaseException:
            self.device.disconnect()
            raise
        self.has_events = callable(getattr(self.device, "get_teleop_events", None))
        if drives == "events" and not self.has_events:
            self.device.disconnect()
            raise ValueError(f"teleoperator {self.name} has no teleop events; use teleoperator_drives: always")
        self.always = drives == "always" or (drives == "auto" and not self.has_events)
        self._pressed: set[str] = set()  # events on at the last step: a held button counts once

    def act(self, view: StepView) -> np.ndarray | None:
        events = self._events()
        pressed = {name for name, on in events.items() if on} - {INTERVENTION}
        new, self._pressed = pressed - self._pressed, pressed
        if RERECORD in new:
            self.requests.discard()
        elif SUCCESS in new:
            self.requests.mark(True, view.episode, view.step, by=self.name)
        elif FAILURE in new or TERMINATE in new:
            self.requests.mark(False, view.episode, view.step, by=self.name)
        if not (self.always or events.get(INTERVENTION)):
            return None
        action = self.device.get_action()
        return np.clip(np.array([action[name] for name in self.names], np.float32), self.low, self.high)

    def _events(self) -> dict[str, bool]:
        """The teleoperator's events by their names (LeRobot keys them by the `TeleopEvents` enum)."""
        if not self.has_events:
            return {}
        return {getattr(key, "value", key): bool(on) for key, on in self.device.get_teleop_events().items()}

    def close(self) -> None:
        if self.device.is_connected:
            self.device.disconnect()


def _action_names(names: list[str], robot: Robot) -> list[str]:
    """Which teleoperator action feeds each of the robot's actions, in the robot's order."""
    wanted = getattr(robot, "action_names", None)
    if wanted is None:
        if len(names) != robot.action_space.shape[0]:
            raise ValueError(
                f"the teleoperator gives {len(names)} actions {names}; the robot takes {robot.action_space.shape[0]}"
            )
        return names
    missing = [name for name in wanted if name not in names]
    if missing:
        raise ValueError(f"the teleoperator gives actions {names}; the robot also needs {missing}")
    return list(wanted)
