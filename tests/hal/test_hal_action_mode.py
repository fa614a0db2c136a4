"""What an action means (`ActionMode`) and what holding still is, per robot; and how a person's
motion command becomes an action in those terms (`edge/motion.py`)."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from user_rl.edge.motion import Motion
from user_rl.hal import ActionMode, DeviceDescriptor, Robot, StepResult
from user_rl.hal.lerobot.robot import LeRobotRobot
from user_rl.hal.registry import make_robot, register_robot
from user_rl.sim.gym_adapter import GymRobot
from user_rl.sim.reach import ReachRobot

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "user_rl_example_arm"


class Dial(Robot):
    """Two joints that go where they are told (absolute goals in degrees), pure numpy."""

    device_kind = "robot"
    action_mode = ActionMode.ABSOLUTE_POSITION

    def __init__(self, *, robot_id: str = "dial-0", seed: int | None = None) -> None:
        self.descriptor = DeviceDescriptor("robot", "dial", robot_id, control_hz=10.0)
        self.observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-90.0, 90.0, (2,), np.float32)})
        self.action_space = gym.spaces.Box(-90.0, 90.0, (2,), np.float32)
        self.pos = np.array([30.0, -60.0], np.float32)

    def reset(self, seed: int | None = None):
        return {"pos": self.pos.copy()}

    def step(self, action: np.ndarray) -> StepResult:
        self.pos = np.asarray(action, np.float32)
        return StepResult({"pos": self.pos.copy()}, 0.0, False, False, self.pos.copy())

    def hold_action(self, obs):
        return np.asarray(obs["pos"], np.float32)

    def hold(self) -> None:
        pass


class DialWithoutHoldAction(Dial):
    hold_action = Robot.hold_action


class Undeclared(Robot):
    """A real robot's driver that does not say what its actions mean."""

    device_kind = "robot"
    __init__, reset, step, hold = Dial.__init__, Dial.reset, Dial.step, Dial.hold


register_robot("test_dial")(Dial)
register_robot("test_dial_without_hold_action")(DialWithoutHoldAction)
register_robot("test_dial_undeclared")(Undeclared)


def test_every_built_in_robot_declares_what_its_actions_mean_and_how_it_holds_still() -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        example_arm = importlib.import_module("user_rl_example_arm.driver").ExampleArm
    finally:
        sys.path.remove(str(EXAMPLES))
    assert ReachRobot.action_mode is ActionMode.DELTA and example_arm.action_mode is ActionMode.DELTA
    assert GymRobot.action_mode is ActionMode.EFFORT
    assert LeRobotRobot.action_mode is ActionMode.ABSOLUTE_POSITION and LeRobotRobot.action_mode.absolute
    assert LeRobotRobot.hold_action is not Robot.hold_action
    reach = ReachRobot(seed=0, episode_steps=10)
    assert reach.hold_action(reach.reset(seed=0)).tolist() == [0.0] * reach.action_space.shape[0]
    pendulum = GymRobot(env_id="Pendulum-v1")
    assert pendulum.hold_action(pendulum.reset(seed=0)).tolist() == [0.0]
    assert Dial().hold_action(Dial().reset()).tolist() == [30.0, -60.0]


def test_an_absolute_driver_must_say_how_it_holds_still_and_an_undeclared_real_one_is_logged(caplog) -> None:
    assert make_robot("test_dial").action_mode is ActionMode.ABSOLUTE_POSITION
    with pytest.raises(
        TypeError,
        match=r"'test_dial_without_hold_action' .* declares absolute_position actions "
        r"but does not implement hold_action\(obs\)",
    ):
        make_robot("test_dial_without_hold_action")
    with pytest.raises(NotImplementedError, match="does not implement hold_action"):
        DialWithoutHoldAction().hold_action({"pos": np.zeros(2)})
    with caplog.at_level(logging.WARNING, logger="user_rl.hal.registry"):
        make_robot("test_dial_undeclared")
    assert "'test_dial_undeclared' does not declare action_mode: its actions are taken as deltas" in caplog.text


def test_nothing_held_keeps_an_absolute_robots_pose_and_a_key_moves_one_bounded_step_from_it() -> None:
    motion = Motion(
        ActionMode.ABSOLUTE_POSITION, np.full(2, -90.0), np.full(2, 90.0), np.full(2, 3.0), lambda obs: obs["pos"]
    )
    at = lambda *pos: {"pos": np.array(pos, np.float32)}  # noqa: E731
    assert motion.action([0, 0], at(30, -60)).tolist() == [30, -60]  # a take-over: the pose, never zero
    assert motion.action([0, 0], at(29, -61)).tolist() == [30, -60]  # kept: a sagging arm is not followed down
    assert motion.action([0.5, -1], at(29, -61)).tolist() == [30.5, -64]  # from the CURRENT pose, <= 3 a step
    assert motion.action([1, 0], at(89, 0)).tolist() == [90, 0]  # inside the action space
    assert motion.action([0, 0], at(90, 0)).tolist() == [90, 0]  # let go: holds where it is now
    assert motion.action([0, 0], at(10, 10), episode=1).tolist() == [10, 10]  # a new episode: held where reset left it
    motion.release()  # a take-over or hand-back
    assert motion.action([0, 0], at(12, 10), episode=1).tolist() == [12, 10]
    with pytest.raises(ValueError, match="needs its per-step limit and its hold_action"):
        Motion(ActionMode.ABSOLUTE_POSITION, np.zeros(1), np.ones(1), None, None)


def test_a_relative_robot_holds_still_at_zero_and_a_key_moves_a_share_of_the_range() -> None:
    motion = Motion(ActionMode.DELTA, np.full(2, -2.0), np.full(2, 2.0), None)
    assert motion.action([0, 0], {}).tolist() == [0, 0]
    assert motion.action([0.5, -1], {}).tolist() == [1, -2]
    assert motion.action([5, 0], {}).tolist() == [2, 0]  # a command is at most +-1
    effort = Motion(ActionMode.EFFORT, np.zeros(1), np.ones(1), None)  # a space without zero inside: its edge
    assert effort.action([0], {}).tolist() == [0] and effort.action([1], {}).tolist() == [0.5]
