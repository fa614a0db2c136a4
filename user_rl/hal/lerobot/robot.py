"""Any LeRobot `Robot` (so101_follower, koch_follower, lekiwi, a plugin's) as a HAL robot.

    robot:
      type: lerobot
      options:
        robot: {type: so101_follower, port: /dev/ttyACM0, id: my_arm}   # LeRobot's own config
        control_hz: 30              # shown by `hal discover`; the loop runs at fleet.control_hz
        episode_steps: 300          # a time limit ends each episode (truncated)
        reset: pose                 # or "current": start where the arm is
        reset_pose: {shoulder_pan.pos: 0.0, ...}

Spaces: LeRobot's scalar observation features (`shoulder_pan.pos`, ...) become one float32
vector, `state` (exported again as `observation.state`); each camera (an (H, W, C) feature)
becomes a uint8 image under its own name. The action is the vector of LeRobot's action features,
in their order, with bounds (which the actor's scaling, the safety filter and the ingest need)
from `action_bounds` if given, else from the motors' calibration (degrees over the calibrated
range, or LeRobot's -100..100 and 0..100 ranges). In code, `robot` may also be a LeRobot robot
object already connected.

Its actions are absolute position goals (`ActionMode.ABSOLUTE_POSITION`): holding still is
commanding the observed positions (`hold_action`), and the safety filter limits how far a goal
may be from the current pose in one step (docs/safety.md).

A LeRobot robot has no reward, no episodes and no reset of its own, so each comes from somewhere
else: the reward from `reward.type: labels` (a person marks success at the teleop page or with a
LeRobot teleoperator's success event) or `reward.type: classifier`; an episode ends at the time
limit or when a person labels it; a reset drives to `reset_pose` or starts where the arm is, after
`reset_wait_s` for a person to put the scene back (with `reset_s`, below `fleet.stall_s`, or the
edge takes the reset for a stalled robot).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from user_rl.hal.action import ActionMode
from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.hal.lerobot.devices import connect_device, device_config, float_names
from user_rl.hal.robot import Health, Observation, Robot, StepResult

STATE = "state"
Bounds = dict[str, tuple[float, float]]


class LeRobotRobot(Robot):
    """A connected LeRobot robot behind the HAL contract. A real robot: it holds by commanding the
    positions it last observed. Its actions are `<motor>.pos` goals: absolute positions."""

    device_kind = "robot"
    action_mode = ActionMode.ABSOLUTE_POSITION

    def __init__(
        self,
        robot: dict[str, Any] | Any,
        *,
        robot_id: str = "lerobot-0",
        seed: int | None = None,
        control_hz: float = 30.0,
        episode_steps: int = 300,
        action_bounds: dict[str, list[float]] | None = None,
        reset: Literal["current", "pose"] = "current",
        reset_pose: dict[str, float] | None = None,
        reset_s: float = 2.0,
        reset_wait_s: float = 0.0,
        calibrate: bool = False,
        instruction: str = "",
    ) -> None:
        if reset not in ("current", "pose"):
            raise ValueError(f"reset must be 'current' or 'pose', got {reset!r}")
        if episode_steps < 1:
            raise ValueError(f"episode_steps must be at least 1, got {episode_steps}")
        self.episode_steps, self.reset_mode = episode_steps, reset
        self.reset_s, self.reset_wait_s = reset_s, reset_wait_s
        if isinstance(robot, dict):  # LeRobot's config: connected here
            self.device = connect_device("robot", robot, calibrate=calibrate)  # checks the config first
            self.lerobot_type: str = robot["type"]
        else:  # a LeRobot robot object, made and connected by the caller
            self.device, self.lerobot_type = robot, str(getattr(robot, "name", type(robot).__name__))
        try:
            self.observation_space, self.action_space, self.state_names, self.action_names, self.cameras = _spaces(
                self.device, action_bounds
            )
            self.reset_pose = _checked_pose(reset_pose, self.action_names, reset)
        except BaseException:
            self.device.disconnect()
            raise
        self.descriptor = DeviceDescriptor(
            "robot",
            f"lerobot:{self.lerobot_type}",
            robot_id,
            control_hz,
            instruction,
            tuple(self.cameras),
            {"lerobot_type": self.lerobot_type, "lerobot_id": str(self.device.id)},
        )
        self._last_raw: dict[str, Any] = {}
        self._state_index = {name: i for i, name in enumerate(self.state_names)}
        self._last_sent: dict[str, float] = {}
        self._steps = 0

    @classmethod
    def spaces(
        cls, robot: dict[str, Any], action_bounds: dict[str, list[float]] | None = None, **_: Any
    ) -> tuple[gym.spaces.Dict, gym.spaces.Box]:
        """The spaces without connecting (features and calibration are known before connect)."""
        from lerobot.robots.utils import make_robot_from_config

        device = make_robot_from_config(device_config("robot", robot))
        observation_space, action_space, *_ = _spaces(device, action_bounds)
        return observation_space, action_space

    # -- the HAL contract ----------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Observation:
        if self.reset_mode == "pose":
            self._send(self.reset_pose)
            time.sleep(self.reset_s)
        if self.reset_wait_s > 0:
            self.hold()
            time.sleep(self.reset_wait_s)
        self._steps = 0
        return self._observe()

    def step(self, action: np.ndarray) -> StepResult:
        values = np.clip(np.asarray(action, np.float64), self.action_space.low, self.action_space.high)
        sent = self._send(dict(zip(self.action_names, values.tolist())))
        applied = np.array([sent.get(name, value) for name, value in zip(self.action_names, values)], np.float32)
        obs = self._observe()
        self._steps += 1
        return StepResult(obs, 0.0, False, self._steps >= self.episode_steps, applied)

    def hold(self) -> None:
        """Command every joint to where it was last seen (a position-controlled arm then stays put);
        joints never observed keep their last command."""
        target = {
            name: float(self._last_raw[name]) if name in self._last_raw else self._last_sent[name]
            for name in self.action_names
            if name in self._last_raw or name in self._last_sent
        }
        if target:
            self._send(target)

    def hold_action(self, obs: Observation) -> np.ndarray:
        """The goals that keep every joint where `obs` shows it: each action's own observed feature
        (`<motor>.pos`), else its last goal sent (else the middle of its range: never sent, never seen)."""
        state = np.asarray(obs[STATE], np.float64)
        space = self.action_space
        goals = [
            state[self._state_index[name]] if name in self._state_index else self._last_sent.get(name, (low + high) / 2)
            for name, low, high in zip(self.action_names, space.low, space.high)
        ]
        return np.clip(np.array(goals, np.float64), space.low, space.high).astype(space.dtype)

    def health(self) -> Health:
        connected = bool(self.device.is_connected)
        return Health(connected, "" if connected else "disconnected")

    def close(self) -> None:
        if getattr(self, "device", None) is not None and self.device.is_connected:
            self.device.disconnect()

    # -- helpers -------------------------------------------------------------------------------
    def _send(self, action: dict[str, float]) -> dict[str, float]:
        sent = self.device.send_action(action) or action
        self._last_sent.update({k: float(v) for k, v in sent.items() if k in self.action_names})
        return sent

    def _observe(self) -> Observation:
        raw = self.device.get_observation()
        missing = [name for name in self.state_names + self.cameras if name not in raw]
        if missing:
            raise RuntimeError(f"LeRobot robot {self.lerobot_type!r} observation lacks {missing}")
        self._last_raw = raw
        obs = {STATE: np.array([raw[name] for name in self.state_names], np.float32)}
        obs.update({camera: np.asarray(raw[camera], np.uint8) for camera in self.cameras})
        return obs


def _spaces(
    device: Any, action_bounds: dict[str, list[float]] | None
) -> tuple[gym.spaces.Dict, gym.spaces.Box, list[str], list[str], list[str]]:
    """(observation space, action space, state names, action names, camera names) of a LeRobot robot."""
    what = f"LeRobot robot {type(device).__name__}"
    features = device.observation_features
    state_names = float_names(features, f"{what}'s observation")
    cameras = [name for name, kind in features.items() if isinstance(kind, tuple) and len(kind) == 3]
    odd = [name for name in features if name not in state_names and name not in cameras]
    if odd:
        raise ValueError(f"{what}: observation features {odd} are neither scalars nor (H, W, C) images")
    action_names = float_names(device.action_features, f"{what}'s action")
    bounds = _action_bounds(device, action_names, action_bounds)
    spaces = {STATE: gym.spaces.Box(-np.inf, np.inf, (len(state_names),), np.float32)}
    spaces.update({c: gym.spaces.Box(0, 255, tuple(features[c]), np.uint8) for c in cameras})
    low = np.array([bounds[name][0] for name in action_names], np.float32)
    high = np.array([bounds[name][1] for name in action_names], np.float32)
    return gym.spaces.Dict(spaces), gym.spaces.Box(low, high, dtype=np.float32), state_names, action_names, cameras


def _action_bounds(device: Any, names: list[str], given: dict[str, list[float]] | None) -> Bounds:
    """Bounds per action feature: the config's, else the calibration's; every one must be known."""
    bounds = calibrated_bounds(device)
    for name, pair in (given or {}).items():
        if name not in names:
            raise ValueError(f"action_bounds: {name!r} is not an action of this robot; its actions: {names}")
        low, high = (float(v) for v in pair)
        if not low < high:
            raise ValueError(f"action_bounds: {name!r} needs low < high, got {pair!r}")
        bounds[name] = (low, high)
    missing = [name for name in names if name not in bounds]
    if missing:
        raise ValueError(
            f"no bounds for actions {missing}: the robot has no calibration for them; set "
            f"robot.options.action_bounds {{<action>: [low, high]}} (in LeRobot's units)"
        )
    return bounds


def calibrated_bounds(device: Any) -> Bounds:
    """Each calibrated motor's `<motor>.pos` range in LeRobot's units: degrees about the middle of
    the calibrated range, or the fixed -100..100 / 0..100 ranges (`lerobot.motors.MotorNormMode`)."""
    bus, calibration = getattr(device, "bus", None), getattr(device, "calibration", None)
    if bus is None or not calibration:
        return {}
    bounds: Bounds = {}
    for name, motor in getattr(bus, "motors", {}).items():
        cal = calibration.get(name)
        mode = getattr(getattr(motor, "norm_mode", None), "value", None)
        if cal is None:
            continue
        if mode == "range_m100_100":
            bounds[f"{name}.pos"] = (-100.0, 100.0)
        elif mode == "range_0_100":
            bounds[f"{name}.pos"] = (0.0, 100.0)
        elif mode == "degrees":
            steps = bus.model_resolution_table[motor.model] - 1
            middle = (cal.range_min + cal.range_max) / 2
            bounds[f"{name}.pos"] = ((cal.range_min - middle) * 360 / steps, (cal.range_max - middle) * 360 / steps)
    return bounds


def _checked_pose(pose: dict[str, float] | None, names: list[str], reset: str) -> dict[str, float]:
    if reset != "pose":
        if pose:
            raise ValueError("reset_pose is used only with reset: pose")
        return {}
    if not pose or sorted(pose) != sorted(names):
        raise ValueError(f"reset: pose needs reset_pose with a value for each action {names}, got {pose!r}")
    return {name: float(pose[name]) for name in names}
