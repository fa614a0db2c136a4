"""`example_arm`: a two-joint arm behind a TCP controller, as a user-rl robot driver.

The task: bring both joints to zero. An action is a joint step in [-1, 1], scaled to at most
MAX_STEP_RAD per control tick; the controller clamps to its joint limits, and the step reports the
action it really applied. The arm's controller paces the loop (one MOVE per tick of its clock).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from user_rl.hal import ActionMode, DeviceDescriptor, Health, Robot, StepResult
from user_rl_example_arm.client import ArmClient

JOINTS = 2
JOINT_LIMIT_RAD = 3.0  # the controller stops each joint here
MAX_STEP_RAD = 0.1  # what action 1.0 moves a joint in one tick
MAX_TEMP_C = 70.0  # above this the arm is unhealthy: the fleet table says so


class ExampleArm(Robot):
    device_kind = "robot"  # real hardware: never paced to the learner, and hold() is required
    action_mode = ActionMode.DELTA  # an action is a joint step: zero keeps the pose (a take-over sends it)

    def __init__(
        self,
        *,
        controller: str,
        robot_id: str = "example_arm-0",
        seed: int | None = None,
        episode_steps: int = 100,
        timeout_s: float = 5.0,
    ) -> None:
        """`controller`: the arm controller's HOST:PORT. `timeout_s`: how long one call waits for it
        before the driver raises (the edge then stops; placed by Ray, it is restarted)."""
        self.client = ArmClient(controller, robot_id, timeout_s)  # refused / timed out: discovery reports it
        if self.client.joints != JOINTS:
            self.client.close()
            raise ValueError(
                f"{robot_id}: the controller at {controller} has {self.client.joints} joints; "
                f"this driver drives {JOINTS}"
            )
        self.descriptor = DeviceDescriptor(
            kind="robot",
            model="example_arm",
            id=robot_id,
            control_hz=self.client.rate_hz,
            instruction="bring the joints to zero",
            extra={"firmware": self.client.firmware, "controller": controller},
            joint_limits=((-JOINT_LIMIT_RAD, JOINT_LIMIT_RAD),) * JOINTS,
        )
        self.observation_space, self.action_space = self.spaces()
        self.rng = np.random.default_rng(seed)
        self.episode_steps = episode_steps
        self.joints = np.asarray(self.client.read(), np.float32)
        self.t = 0

    @classmethod
    def spaces(cls, **options: object) -> tuple[gym.spaces.Dict, gym.spaces.Box]:
        """The spaces without connecting, so a learner on another machine can start before any arm."""
        observation = gym.spaces.Dict(
            {"joints": gym.spaces.Box(-JOINT_LIMIT_RAD, JOINT_LIMIT_RAD, (JOINTS,), np.float32)}
        )
        return observation, gym.spaces.Box(-1.0, 1.0, (JOINTS,), np.float32)

    def reset(self, seed: int | None = None) -> dict[str, np.ndarray]:
        """A new episode starts from a random pose, so the policy learns from everywhere."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        start = self.rng.uniform(-1.0, 1.0, JOINTS)
        self.joints = np.asarray(self.client.goto(start.tolist()), np.float32)
        self.t = 0
        return {"joints": self.joints.copy()}

    def step(self, action: np.ndarray) -> StepResult:
        before = self.joints
        self.joints = np.asarray(self.client.move((MAX_STEP_RAD * np.asarray(action, np.float64)).tolist()), np.float32)
        applied = ((self.joints - before) / MAX_STEP_RAD).astype(np.float32)  # after the controller's limits
        self.t += 1
        reward = -float(np.abs(self.joints).sum())
        return StepResult({"joints": self.joints.copy()}, reward, False, self.t >= self.episode_steps, applied)

    def predict(self, action: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Where the action takes the joints, so the safety filter can keep them inside the limits."""
        return self.joints + MAX_STEP_RAD * np.asarray(action, np.float32), None

    def hold(self) -> None:
        """The e-stop and the watchdog call this: the controller servos on the current pose."""
        self.joints = np.asarray(self.client.hold(), np.float32)

    def health(self) -> Health:
        """Asked once a heartbeat; what it says shows in `user-rl status`."""
        try:
            status = self.client.status()
        except (OSError, RuntimeError) as exc:
            return Health(False, f"controller unreachable: {exc!r}")
        if status.get("fault", "none") != "none":
            return Health(False, f"controller fault: {status['fault']}")
        if float(status.get("temp_c", 0.0)) > MAX_TEMP_C:
            return Health(False, f"motors at {status['temp_c']} C (limit {MAX_TEMP_C:g} C)")
        return Health(True)

    def close(self) -> None:
        self.client.close()
