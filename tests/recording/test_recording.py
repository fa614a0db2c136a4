"""`record` and `replay` on an arm of absolute position goals written for the test (pure numpy, no
LeRobot: tests/lerobot/test_lerobot_record_replay.py runs the commands on LeRobot's plugin arm).

A scripted person stands in for a LeRobot teleoperator: it drives on every step and presses its
events at given reads (one read per step, reset time included), so episodes end where the script
says. The buffer the recording writes is read back as `buffer export` reads it."""

from __future__ import annotations

import io
import json
import threading
import time
import urllib.request
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from tests.support.recordings import write_episode as write_recorded
from user_rl.cloud.buffer.episodes import EpisodeFilter, read_episodes, recorded_rates
from user_rl.config import TeleopConfig, build_config
from user_rl.edge.intervention import InterventionMux, StepView
from user_rl.edge.operator import OperatorRequests
from user_rl.edge.teleop import make_source, start_server
from user_rl.hal import ActionMode, DeviceDescriptor, Robot, StepResult
from user_rl.hal.registry import register_robot
from user_rl.recording.driving import RobotThread
from user_rl.recording.keys import TerminalKeys
from user_rl.recording.record import Recorder, RecordSettings
from user_rl.recording.replay import ReplayRefused, replay
from user_rl.recording.writer import EpisodeWriter
from user_rl.rewards import make_reward
from user_rl.robots.estop import EStopLatch
from user_rl.robots.safety import ActionFilter, SafetySettings
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import ACTOR_PERSON, LABEL_PERSON

HZ = 100.0


class Arm(Robot):
    """Joints that go where they are told (absolute goals, degrees), at most 10 degrees a command.
    Keeps each command it got, with the time and the position before it."""

    device_kind = "robot"
    action_mode = ActionMode.ABSOLUTE_POSITION
    built: list[Arm] = []

    def __init__(
        self, *, robot_id: str = "arm-0", seed: int | None = None, joints: int = 2, stall_after: int = -1
    ) -> None:
        self.descriptor = DeviceDescriptor("robot", "test_arm", robot_id, control_hz=HZ)
        self.action_space = gym.spaces.Box(-90.0, 90.0, (joints,), np.float32)
        self.observation_space = gym.spaces.Dict({"state": gym.spaces.Box(-90.0, 90.0, (joints,), np.float32)})
        self.position = np.zeros(joints, np.float32)
        self.stall_after = stall_after
        self.sent: list[tuple[float, np.ndarray, np.ndarray]] = []  # (time, goal, position before)
        self.holds = 0
        type(self).built.append(self)

    def reset(self, seed: int | None = None) -> dict[str, np.ndarray]:
        return {"state": self.position.copy()}

    def step(self, action: np.ndarray) -> StepResult:
        if 0 <= self.stall_after <= len(self.sent):
            time.sleep(3.0)  # a bus that stopped answering
        goal = np.asarray(action, np.float32).copy()
        self.sent.append((time.monotonic(), goal, self.position.copy()))
        self.position = (self.position + np.clip(goal - self.position, -10.0, 10.0)).astype(np.float32)
        return StepResult({"state": self.position.copy()}, 0.0, False, False, goal)

    def hold_action(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(obs["state"], np.float32)

    def hold(self) -> None:
        self.holds += 1


register_robot("test_record_arm")(Arm)


def path(read: int) -> np.ndarray:
    """Where the scripted person drives the arm at each read: a slow circle about (30, -20)."""
    angle = 2 * np.pi * read / 40
    return np.array([30 + 10 * np.sin(angle), -20 + 5 * np.cos(angle)], np.float32)


class Person:
    """A LeRobot teleoperator with events, as `LeRobotTeleop` makes it: drives on every step, and
    presses an event at the reads the script gives."""

    name, actor = "pad", pb.ACTOR_HUMAN

    def __init__(self, requests: OperatorRequests, presses: dict[int, str]) -> None:
        self.requests, self.presses, self.reads = requests, presses, 0

    def act(self, view: StepView) -> np.ndarray:
        press, read = self.presses.get(self.reads), self.reads
        self.reads += 1
        if press == "rerecord":
            self.requests.discard()
        elif press in ("success", "failure"):
            self.requests.mark(press == "success", view.episode, view.step, by=self.name)
        return path(read)


def recorder(tmp_path: Path, robot: Arm, sources: list, requests: OperatorRequests, **settings) -> Recorder:
    settings = {
        "episodes": 2,
        "episode_time_s": 0.2,
        "reset_time_s": 0.05,
        "task": "circle",
        "control_hz": HZ,
    } | settings
    writer = EpisodeWriter(
        tmp_path / "buffer", "arm-0", robot.observation_space, robot.action_space, "circle", HZ, batch_rows=8
    )
    return Recorder(
        robot,
        RobotThread(1.0, "arm-0"),
        InterventionMux(sources),
        requests,
        writer,
        RecordSettings(**settings),
        ActionFilter(robot.action_space, SafetySettings(max_action_delta=200.0), robot, HZ),
        make_reward("labels", robot.observation_space),
        EStopLatch(tmp_path / "ESTOP"),
        say=lambda line: None,
    )


def episodes(buffer: Path, discarded: bool = True) -> list:
    return list(read_episodes(buffer, EpisodeFilter(with_discarded=discarded)))


def test_episodes_are_kept_discarded_and_labelled_as_people_ask_and_reset_time_is_not_recorded(
    tmp_path: Path,
) -> None:
    arm, requests = Arm(), OperatorRequests()
    # 20 steps an episode, 5 of reset time: re-record pressed at read 7 (that episode: 8 steps, then its
    # reset time: reads 8-12), the next one runs out of time (reads 13-32, reset 33-37), the last ends
    # with success at read 42 (its 5th step; the last episode has no reset time)
    rec = recorder(tmp_path, arm, [Person(requests, {7: "rerecord", 42: "success"})], requests)
    summary = rec.run()
    rec.writer.close()
    assert (summary.kept, summary.discarded, summary.steps, summary.lengths) == (2, 1, 25, [20, 5])
    assert not summary.failed and summary.stopped == ""
    assert len(arm.sent) == 8 + 5 + 20 + 5 + 5  # what the robot did, reset time included
    dropped, timed_out, success = episodes(tmp_path / "buffer")
    assert [len(e) for e in (dropped, timed_out, success)] == [8, 20, 5]  # reset time is not in the buffer
    assert dropped.end_reason == "discard" and [len(e) for e in episodes(tmp_path / "buffer", False)] == [20, 5]
    for episode, first_read in ((timed_out, 13), (success, 38)):
        steps = episode.steps
        assert (steps["actor"] == pb.ACTOR_HUMAN).all() and (steps["policy_version"] == 0).all()
        np.testing.assert_array_equal(steps["step"], np.arange(len(episode)))
        np.testing.assert_allclose(steps["action"], [path(first_read + i) for i in range(len(episode))])
        assert episode.final_obs is not None  # the observation after its last step
    assert timed_out.status == "truncated" and (timed_out.steps["label"] == pb.LABEL_NONE).all()
    assert success.status == "terminated" and success.steps["label"][-1] == pb.LABEL_SUCCESS
    assert success.steps["label_by"][-1] == pb.LABEL_BY_PERSON and success.steps["reward"].tolist() == [0] * 4 + [1]
    assert recorded_rates(tmp_path / "buffer") == {"arm-0": HZ}
    # Who drove and who labelled, by name: the teleoperator by its source's name.
    for episode in (dropped, timed_out, success):
        assert {episode.people[int(i)] for i in episode.steps[ACTOR_PERSON]} == {"pad"}
    assert success.people[int(success.steps[LABEL_PERSON][-1])] == "pad" and not success.steps[LABEL_PERSON][:-1].any()


def test_re_record_in_the_reset_time_discards_the_episode_just_recorded(tmp_path: Path) -> None:
    arm, requests = Arm(), OperatorRequests()
    # the first episode runs out of time at read 19; re-record is pressed in its reset time (read 22)
    rec = recorder(tmp_path, arm, [Person(requests, {22: "rerecord"})], requests)
    summary = rec.run()
    rec.writer.close()
    assert (summary.kept, summary.discarded) == (2, 1)
    first, again, last = episodes(tmp_path / "buffer")
    assert first.end_reason == "discard" and len(first) == 20 and first.status == "truncated"
    assert again.end_reason == last.end_reason == "" and len(again) == len(last) == 20
    np.testing.assert_allclose(again.steps["action"][0], path(23))  # recorded again right after the press


def test_a_driver_whose_page_drops_ends_the_episode_truncated_and_the_robot_holds_still(tmp_path: Path) -> None:
    arm, requests = Arm(), OperatorRequests()
    settings = TeleopConfig(enabled=True, token="t" * 24, command_timeout_s=5.0, hand_back_after_s=0.3)
    page = make_source(arm, settings, max_action_delta=2.0)
    rec = recorder(tmp_path, arm, [page], requests, episodes=2, episode_time_s=5.0, reset_time_s=0.2)
    server = start_server(rec, page, settings)  # the edge's page serves a recording as it is
    done: list = []
    thread = threading.Thread(target=lambda: done.append(rec.run()), daemon=True)
    thread.start()
    time.sleep(0.1)
    assert rec.steps > 0 and not episodes_written(tmp_path)  # nobody drives yet: the robot holds, nothing recorded
    with urllib.request.urlopen(f"{server.address}api/state?token={'t' * 24}", timeout=10) as answer:
        state = json.load(answer)
    assert (state["robot"], state["driver"], state["episode"]) == ("arm-0", "policy", 0)
    page.take_over("c1", "alice")
    page.command("c1", 1, [1.0, 0.0])  # joint 1 up
    wait_until(lambda: len(arm.sent) > 40, 10, "steps driven from the page")
    lost_at = len(arm.sent)
    page.lost("c1")
    wait_until(lambda: len(arm.sent) > lost_at + 25, 10, "the reset time")
    rec.quit()  # the next episode waits for a driver; stop there
    thread.join(10)
    server.close()
    (summary,) = done
    rec.writer.close()
    (episode,) = episodes(tmp_path / "buffer")
    assert summary.kept == 1 and episode.status == "truncated" and 30 <= len(episode) <= lost_at
    assert episode.steps["action"][-1][0] > episode.steps["action"][0][0]  # the page moved joint 1
    held = np.array([goal for _, goal, _ in arm.sent[lost_at + 2 :]])
    np.testing.assert_allclose(held, np.tile(held[0], (len(held), 1)))  # after the drop: one goal, held


def episodes_written(tmp_path: Path) -> int:
    from user_rl.cloud.buffer.index import BufferIndex

    index = BufferIndex(tmp_path / "buffer" / "index.sqlite", read_only=True)
    try:
        return len(index.episodes())
    finally:
        index.close()


def test_a_robot_that_stops_answering_ends_the_recording_and_keeps_the_finished_episodes(tmp_path: Path) -> None:
    arm, requests = Arm(stall_after=25), OperatorRequests()
    rec = recorder(tmp_path, arm, [Person(requests, {})], requests, episodes=3, reset_time_s=0.0)
    rec.calls.stall_s = 0.5
    started = time.monotonic()
    summary = rec.run()
    rec.writer.close()
    assert time.monotonic() - started < 2.5
    assert summary.failed and summary.kept == 1 and summary.discarded == 1
    assert "(filtered_step) did not return within 0.5 s (fleet.stall_s): the robot stopped" in summary.stopped
    kept, cut = episodes(tmp_path / "buffer")
    assert len(kept) == 20 and kept.end_reason == "" and cut.end_reason == "discard"


def test_terminal_keys_make_the_requests_a_teleoperator_makes() -> None:
    requests, stopped, said = OperatorRequests(), [], []
    keys = TerminalKeys(requests, lambda: stopped.append(True), said.append, io.StringIO("s\nF\nr\n\nq\nx\n"))
    keys.start()._thread.join(5)
    assert stopped == [True] and said and "s success" in said[0]
    keys.press("s")
    assert requests.take_label() == pb.LABEL_SUCCESS
    keys.press("f")
    assert requests.take_label() == pb.LABEL_FAILURE
    keys.press("r")
    assert requests.take_reset() == "discard"
    keys.press("")
    assert requests.take_reset() == "reset"


def write_episode(buffer: Path, actions: np.ndarray, hz: float = 50.0, joints: int = 2) -> None:
    arm = Arm(joints=joints)
    write_recorded(buffer, "arm-0", arm.observation_space, arm.action_space, actions, hz, task="circle")


def replay_config(joints: int = 2):
    return build_config(
        {
            "robot": {"type": "test_record_arm", "options": {"joints": joints}},
            "fleet": {"num_robots": 1, "control_hz": 10, "stall_s": 2},
            "safety": {"max_action_delta": 5.0},
        }
    )


def test_replay_sends_the_recorded_actions_at_the_recorded_rate_through_the_safety_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # where the e-stop latch is looked for
    actions = np.array([path(i) for i in range(40)])
    write_episode(tmp_path / "buffer", actions, hz=50.0)
    summary = replay(replay_config(), tmp_path / "buffer", 0, say=lambda line: None)
    arm = Arm.built[-1]
    assert (summary.steps, summary.of, summary.fps, summary.stopped) == (40, 40, 50.0, "")
    goals = np.array([goal for _, goal, _ in arm.sent])
    before = np.array([position for _, _, position in arm.sent])
    assert len(goals) == 40 and arm.holds == 1  # and it held at the end
    assert (np.abs(goals - before) <= 5.0 + 1e-4).all()  # no goal further than max_action_delta from the pose
    limited = int(np.flatnonzero(~np.isclose(goals, actions, atol=1e-4).all(axis=1)).max()) + 1
    assert 5 <= limited <= 8 and summary.safety["rate_limited"] == limited  # 0 -> 30 degrees at 5 a step
    np.testing.assert_allclose(goals[limited:], actions[limited:], atol=1e-4)  # then exactly as recorded, in order
    intervals = np.diff([t for t, _, _ in arm.sent])
    assert abs(np.median(intervals) - 1 / 50) < 0.004, np.median(intervals)


def test_replay_refuses_a_nan_action_and_another_action_space_before_sending_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    actions = np.array([path(i) for i in range(10)])
    actions[3, 1] = np.nan
    write_episode(tmp_path / "nan", actions)
    built = len(Arm.built)
    with pytest.raises(ReplayRefused, match=r"the action of step 3 is \[.*nan\], not finite: refused; nothing was"):
        replay(replay_config(), tmp_path / "nan", 0, say=lambda line: None)
    assert len(Arm.built) == built  # refused before the robot was made
    write_episode(tmp_path / "two", np.array([path(i) for i in range(10)]))
    with pytest.raises(
        ReplayRefused, match=r"cannot play on test_record_arm-0 \(here\): the action is float32\[2\] there and "
    ):
        replay(replay_config(joints=3), tmp_path / "two", 0, say=lambda line: None)
    assert Arm.built[-1].sent == []
