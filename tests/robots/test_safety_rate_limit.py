"""A robot of absolute position goals gets a default rate limit from its declared action bounds,
measured from its current pose; a configured limit wins; relative robots keep none by default."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from user_rl.hal import ActionMode, DeviceDescriptor, Robot, StepResult
from user_rl.robots.safety import FULL_RANGE_S, ActionFilter, SafetySettings, step_limit
from user_rl.sim.reach import ReachRobot


class Dial(Robot):
    """Three joints that go where they are told (absolute goals, degrees), declared at 30 Hz."""

    device_kind = "robot"
    action_mode = ActionMode.ABSOLUTE_POSITION

    def __init__(self, low: float = -90.0, high: float = 90.0) -> None:
        self.descriptor = DeviceDescriptor("robot", "dial", "dial-0", control_hz=30.0)
        self.action_space = gym.spaces.Box(low, high, (3,), np.float32)
        self.observation_space = gym.spaces.Dict({"pos": self.action_space})

    def reset(self, seed: int | None = None):
        raise NotImplementedError

    def step(self, action: np.ndarray) -> StepResult:
        raise NotImplementedError

    def hold_action(self, obs):
        return np.asarray(obs["pos"], np.float32)

    def hold(self) -> None:
        pass


def test_the_default_limit_lets_a_joint_cross_its_range_in_full_range_s_and_a_set_one_wins() -> None:
    dial = Dial()
    assert step_limit(dial.action_space, None, dial, control_hz=20.0).tolist() == [180 / (FULL_RANGE_S * 20)] * 3
    assert step_limit(dial.action_space, None, dial).tolist() == [180 / (FULL_RANGE_S * 30)] * 3  # the driver's rate
    assert step_limit(dial.action_space, 0.5, dial).tolist() == [0.5] * 3
    reach = ReachRobot(seed=0, episode_steps=10)
    assert step_limit(reach.action_space, None, reach) is None  # a delta robot: no default
    assert ActionFilter(reach.action_space, SafetySettings(), reach).max_delta is None
    unbounded = Dial(-np.inf, np.inf)
    with pytest.raises(
        ValueError,
        match="dial-0: its actions are absolute positions but its action space has no "
        "finite bounds, so no default rate limit: set safety.max_action_delta",
    ):
        step_limit(unbounded.action_space, None, unbounded)


def test_an_absolute_goal_is_limited_from_the_current_pose_and_a_refused_one_holds_it() -> None:
    dial = Dial()
    safety = ActionFilter(dial.action_space, SafetySettings(), dial, control_hz=30.0)  # 3 degrees a step
    pose = {"pos": np.array([60.0, -45.0, 30.0], np.float32)}
    # The first goal after a start (no action sent yet) is limited too: zero is a pose, 60 degrees away.
    assert safety(np.zeros(3), pose).tolist() == [57.0, -42.0, 27.0]
    assert safety.violations["rate_limited"] == 1
    assert safety(pose["pos"], pose).tolist() == [60.0, -45.0, 30.0]  # holding still always passes
    assert safety(np.array([61.0, -46.0, 30.0]), pose).tolist() == [61.0, -46.0, 30.0]
    assert safety(np.array([np.nan, 0, 0]), pose).tolist() == [60.0, -45.0, 30.0]  # refused: hold the pose
    assert safety.violations["non_finite"] == 1
    assert safety(np.full(3, 500.0), pose).tolist() == [63.0, -42.0, 33.0]  # clipped, then limited
