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


def test_steps_on_which_the_driver_holds_nothing_are_flagged_idle() -> None:
    web = source()
    mux = InterventionMux([web])
    mux.choose(view(0))
    assert not mux.idle  # the policy acted
    web.take_over("c1", "alice")
    assert mux.choose(view(1))[1] == pb.ACTOR_HUMAN and mux.idle  # took over, holds nothing yet
    web.command("c1", 1, [1, 0, 0])
    assert mux.choose(view(2))[0].tolist() == [1, 0, 0] and not mux.idle
    web.command("c1", 2, [0, 0, 0])  # lets go: the robot holds still
    assert not mux.choose(view(3))[0].any() and mux.idle
    web.lost("c1")  # the page's connection dropped: held still, nobody holds anything
    assert mux.choose(view(4))[1] == pb.ACTOR_HUMAN and mux.idle
    assert mux.status()["idle_steps"] == 3


def test_a_gripper_setting_counts_as_held_only_while_the_gripper_moves() -> None:
    """The page latches the gripper's open / close setting in every command: a new setting is a grasp
    (held for the steps the gripper needs to cross its range: 2 for this delta robot, whose full
    command moves half the range), keeping it afterwards is holding nothing."""
    web = WebTeleop((3,), -np.ones(3), np.ones(3), gripper_index=2)
    web.take_over("c1", "alice")
    web.command("c1", 1, [0, 0, 1])  # close
    assert [(web.act(view(i))[2], web.idle) for i in range(4)] == [(1, False), (1, False), (1, True), (1, True)]
    web.command("c1", 1, [0, 0, 1])  # the page refreshes the latched setting: not a motion
    assert web.idle_s is not None
    web.command("c1", 2, [1, 0, 1])  # a key held beside it moves the arm
    assert web.act(view(4)).tolist() == [1, 0, 1] and not web.idle and web.idle_s is None
    web.command("c1", 3, [0, 0, -1])  # open
    assert [web.act(view(5 + i)) is not None and web.idle for i in range(3)] == [False, False, True]


def test_a_driver_who_commands_nothing_for_idle_hand_back_s_is_handed_back() -> None:
    web = WebTeleop((3,), -np.ones(3), np.ones(3), idle_hand_back_s=1.0)
    mux = InterventionMux([web])
    web.take_over("c1", "alice")
    assert mux.choose(view(0))[1] == pb.ACTOR_HUMAN
    for i in range(12):  # a held key, refreshed by the page for longer than idle_hand_back_s: she is active
        web.command("c1", 1, [1, 0, 0])
        time.sleep(0.1)
        assert mux.choose(view(1 + i))[1] == pb.ACTOR_HUMAN
    web.command("c1", 2, [0, 0, 0])
    time.sleep(0.3)
    assert mux.choose(view(13))[1] == pb.ACTOR_HUMAN and mux.idle and web.took_back() is None
    time.sleep(0.8)
    assert mux.choose(view(14))[1] == pb.ACTOR_POLICY  # the policy acts on this very step
    handed = web.took_back()
    assert handed is not None and (handed.client, handed.person) == ("c1", "alice") and handed.idle_s >= 1.0
    assert web.took_back() is None and web.driver == (None, "") and web.idle_hand_backs == 1
    web.command("c1", 1, [1, 0, 0])  # a refresh her page sent before it knew: ignored, not an error ...
    assert mux.choose(view(15))[1] == pb.ACTOR_POLICY
    assert [(e.source, e.kind) for e in mux.events] == [("teleop:alice", "take_over"), ("teleop", "hand_back")]
    web.take_over("c2", "bob")  # anyone may take over again
    with pytest.raises(NotYourTurn, match="bob is driving"):  # ... until then
        web.command("c1", 1, [1, 0, 0])
    never = WebTeleop((3,), -np.ones(3), np.ones(3), idle_hand_back_s=0.0)
    never.take_over("c1", "alice")
    time.sleep(0.35)
    assert never.act(view(0)) is not None and never.idle  # 0: never handed back
