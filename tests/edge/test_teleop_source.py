"""The teleop page's intervention source and key mapping, without a browser."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

from user_rl.config import ConfigError, build_config
from user_rl.edge.intervention import InterventionMux, StepView
from user_rl.edge.operator import StepRecord
from user_rl.edge.teleop.controls import control_map
from user_rl.edge.teleop.source import NotYourTurn, WebTeleop
from user_rl.wire import user_rl_pb2 as pb


def view(step: int) -> StepView:
    return StepView({}, np.full(3, 0.25, np.float32), episode=0, step=step)


def record(step: int, actor: int, sent_at: float) -> StepRecord:
    zeros = np.zeros(3, np.float32)
    return StepRecord({}, zeros, zeros, actor, 0.0, 0, step, -1, False, pb.LABEL_NONE, sent_at)


def source(timeout_s: float = 0.5) -> WebTeleop:
    return WebTeleop((3,), -np.ones(3), np.ones(3), command_timeout_s=timeout_s)


def test_one_person_drives_with_the_commanded_action_and_zero_motion_when_no_key_is_held() -> None:
    web = source()
    mux = InterventionMux([web])
    assert mux.choose(view(0))[1] == pb.ACTOR_POLICY  # nobody took over: the policy acts
    web.take_over("c1", "alice")
    action, actor = mux.choose(view(1))
    assert actor == pb.ACTOR_HUMAN and not action.any() and mux.driver_name == "teleop:alice"
    with pytest.raises(NotYourTurn, match="alice is driving"):
        web.take_over("c2", "bob")
    with pytest.raises(NotYourTurn, match="alice is driving"):
        web.command("c2", 1, [1, 0, 0])
    web.command("c1", 1, [1, 0, 5])  # clipped to the action space
    assert mux.choose(view(2))[0].tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="3 finite numbers"):
        web.command("c1", 2, [1, float("nan"), 0])
    with pytest.raises(ValueError, match="3 finite numbers"):
        web.command("c1", 2, [1, 0])
    assert not web.hand_back("c2") and web.hand_back("c1")
    assert mux.choose(view(3))[1] == pb.ACTOR_POLICY
    assert [(e.source, e.kind) for e in mux.events] == [("teleop:alice", "take_over"), ("teleop", "hand_back")]
    with pytest.raises(NotYourTurn, match="take over before you drive"):
        web.command("c1", 3, [0, 0, 0])


def test_a_command_not_refreshed_in_time_stops_the_robot() -> None:
    web = source(timeout_s=0.2)
    web.take_over("c1", "alice")
    web.command("c1", 1, [1, 0, 0])
    assert web.act(view(0)).tolist() == [1, 0, 0]
    time.sleep(0.1)
    web.command("c1", 1, [1, 0, 0])  # the page refreshes the held key
    time.sleep(0.15)
    assert web.act(view(1)).tolist() == [1, 0, 0]
    time.sleep(0.25)  # the page froze
    assert not web.act(view(2)).any() and web.stale_commands == 1
    web.command("c1", 2, [0, -1, 0])  # a new command moves again
    assert web.act(view(3)).tolist() == [0, -1, 0]


def test_each_commands_first_step_is_reported_once_for_the_latency() -> None:
    web = source()
    web.take_over("c1", "alice")
    web.act(view(0))
    assert web.applied(record(0, pb.ACTOR_HUMAN, 1.0)) is None  # no command yet
    web.command("c1", 7, [1, 0, 0])
    web.act(view(1))
    applied = web.applied(record(1, pb.ACTOR_HUMAN, 2.0))
    assert applied is not None and (applied.client, applied.command_id, applied.sent_at, applied.step) == (
        "c1",
        7,
        2.0,
        1,
    )
    assert applied.received_at <= time.time()
    web.act(view(2))
    assert web.applied(record(2, pb.ACTOR_HUMAN, 3.0)) is None  # the same command again: not a new press


def test_keys_and_gamepad_cover_the_action_space_and_a_gripper_gets_its_own_controls() -> None:
    arm = control_map(gym.spaces.Box(-1, 1, (7,), np.float32), gripper_index=6)
    assert [c.plus_key for c in arm[:3]] == ["KeyD", "KeyW", "KeyE"]
    assert [c.axis for c in arm[:4]] == [0, 1, 2, 3] and arm[4].plus_button == 7
    assert arm[6].name == "gripper" and (arm[6].plus_key, arm[6].minus_key) == ("KeyF", "KeyR")
    keys = [k for c in arm for k in (c.plus_key, c.minus_key)]
    assert len(keys) == len(set(keys))  # no key drives two dimensions
    with pytest.raises(ValueError, match="gripper_index 3 is outside the robot's 3 action dimensions"):
        control_map(gym.spaces.Box(-1, 1, (3,), np.float32), gripper_index=3)
    with pytest.raises(ValueError, match="flat Box"):
        control_map(gym.spaces.Discrete(3))


def test_a_weak_teleop_token_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="teleop.token: must be at least 16 characters"):
        build_config({}, ["teleop.token=short"])
    assert build_config({}, ["teleop.token=abcdefghijklmnop_-"]).teleop.token.get_secret_value() == "abcdefghijklmnop_-"
