"""`user-rl record` and `user-rl replay` as a LeRobot user runs them on a new arm: the plugin arm and the
scripted gamepad of tests/lerobot/plugins, in the LeRobot environment.

The gamepad drives the arm along a slow circle (`PATH`, one pose per read, one read per control step,
reset time included) and presses its events at given reads; the arm logs every command it gets
(time, goal, position before it). The buffer `record` writes, the dataset it exports and the arm's
log are the judges."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml

from tests.lerobot.harness import install_plugins, run_in_lerobot
from tests.support import lerobot_env
from tests.support.recordings import write_episode
from user_rl.cloud.buffer.episodes import EpisodeFilter, read_episodes, recorded_rates
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb

HZ = 20
PATH = [
    [float(30 + 10 * np.sin(2 * np.pi * k / 40)), float(-20 + 5 * np.cos(2 * np.pi * k / 40)), 10.0] for k in range(400)
]
# 30 steps an episode, 10 of reset time: re-record pressed at read 5 (that episode: 6 steps, then its reset
# time: reads 6-15), the next one runs out of time (reads 16-45; reset time 46-55), the last ends with
# success at read 65 (its 10th step; no reset time after the last episode)
PAD = {"type": "sim_pad", "id": "pad", "path": PATH, "rerecord": [5], "success": [65]}
QUIET_PAD = {"type": "sim_pad", "id": "pad", "path": PATH}  # presses nothing
RECORD = ["--episodes", "2", "--episode-time-s", "1.5", "--reset-time-s", "0.5", "--task", "circle the cube"]
TASK = "circle the cube"


def write_config(path: Path, log: Path, fleet: dict | None = None, pad: dict = PAD, **arm) -> Path:
    config = {
        "robot": {
            "type": "lerobot",
            "options": {"robot": {"type": "sim_arm", "id": "arm_r", "log": str(log), **arm}, "calibrate": True},
        },
        "fleet": {"num_robots": 1, "control_hz": HZ, "stall_s": 5.0, **(fleet or {})},
        "reward": {"type": "labels"},
        "intervention": {"teleoperator": pad},
        "safety": {"max_action_delta": 200.0},  # recorded as the pad gives it; replays set their own limit
    }
    path.write_text(yaml.safe_dump(config))
    return path


def arm_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("record_replay")
    return tmp, {**install_plugins(tmp / "site"), "XDG_STATE_HOME": str(tmp / "state")}  # e-stop latches there


def user_rl(python: Path, env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`user-rl ARGS` in the LeRobot environment, with no keys on its stdin."""
    return subprocess.run(
        [str(python), "-m", "user_rl.cli", *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=lerobot_env.REPO,
        env=env,
    )


@pytest.fixture(scope="module")
def recorded(lerobot_python: Path, plugins: tuple[Path, dict[str, str]]) -> dict:
    """`user-rl record` of two episodes (one re-recorded before them, one ended by a success press), with --dataset."""
    tmp, env = plugins
    config = write_config(tmp / "record.yaml", tmp / "record.jsonl")
    buffer, dataset = tmp / "buffer", tmp / "dataset"
    started = time.monotonic()
    done = user_rl(
        lerobot_python, env, "record", config, "--out", buffer, "--dataset", dataset, "--robot", "arm-r", *RECORD
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return {
        "tmp": tmp,
        "env": env,
        "buffer": buffer,
        "dataset": dataset,
        "output": done.stderr,
        "log": arm_log(tmp / "record.jsonl"),
        "seconds": time.monotonic() - started,
    }


def test_record_keeps_the_episodes_people_keep_with_their_labels_and_leaves_the_reset_time_out(
    recorded: dict,
) -> None:
    out = recorded["output"]
    print(f"record took {recorded['seconds']:.1f} s")
    everything = list(read_episodes(recorded["buffer"], EpisodeFilter(with_discarded=True)))
    assert [(len(e), e.end_reason) for e in everything] == [(6, "discard"), (30, ""), (10, "")]
    timed_out, success = read_episodes(recorded["buffer"])  # what an export, attach or replay takes
    for episode, first_read in ((timed_out, 16), (success, 56)):
        steps = episode.steps
        assert episode.robot == "arm-r" and episode.task == TASK
        assert (steps["actor"] == pb.ACTOR_HUMAN).all()  # every step is the person's
        np.testing.assert_array_equal(steps["step"], np.arange(len(episode)))
        np.testing.assert_allclose(steps["action"], PATH[first_read : first_read + len(episode)], atol=1e-4)
        assert episode.final_obs is not None
    assert timed_out.status == "truncated" and (timed_out.steps["label"] == pb.LABEL_NONE).all()
    assert success.status == "terminated" and success.steps["label"][-1] == pb.LABEL_SUCCESS
    assert success.steps["label_by"][-1] == pb.LABEL_BY_PERSON and success.steps["reward"].tolist() == [0] * 9 + [1]
    assert recorded_rates(recorded["buffer"]) == {"arm-r": float(HZ)}
    # the arm got every step, reset time included (none of which is in the buffer), then one hold
    goals = np.array([line["goal"] for line in recorded["log"]])
    assert len(goals) == 6 + 10 + 30 + 10 + 10 + 1
    np.testing.assert_allclose(goals[:-1], PATH[:66], atol=1e-4)
    np.testing.assert_allclose(goals[-1], recorded["log"][-1]["position"])  # the hold: where it stands
    intervals = np.diff([line["t"] for line in recorded["log"][16:46]])  # one episode: no reset in between
    assert abs(np.median(intervals) - 1 / HZ) < 0.01, intervals
    for line in (
        "episode 1/2: recording, up to 1.5 s",
        "episode 1/2: discarded (re-record); recording it again",
        "episode 1/2: resetting for 0.5 s (not recorded; Enter: next episode now)",
        "episode 1/2: kept, 30 steps (time is up); replay it with --episode 0",
        "episode 2/2: kept, 10 steps (ended by a person, success); replay it with --episode 1",
        f"recorded 2 episodes (40 steps at {HZ} Hz) into {recorded['buffer']}; 1 discarded",
    ):
        assert line in out, out[-3000:]


def test_record_writes_a_lerobot_dataset_that_lerobots_loader_opens_and_replay_plays(
    recorded: dict, lerobot_python: Path
) -> None:
    load = (
        "import json, sys\nfrom lerobot.datasets.lerobot_dataset import LeRobotDataset\n"
        "d = LeRobotDataset('local/recorded', root=sys.argv[1])\n"
        "print(json.dumps({'episodes': d.meta.total_episodes, 'frames': d.meta.total_frames, 'fps': d.fps,\n"
        "    'robot_type': d.meta.robot_type, 'task': d[0]['task'], 'action': d[30]['action'].tolist()}))\n"
    )
    done = run_in_lerobot(lerobot_python, "-c", load, str(recorded["dataset"]), env=recorded["env"], timeout=120)
    dataset = json.loads(done.stdout.strip().splitlines()[-1])
    assert {k: dataset[k] for k in ("episodes", "frames", "fps", "robot_type", "task")} == {
        "episodes": 2,
        "frames": 40,
        "fps": HZ,
        "robot_type": "sim_arm",
        "task": TASK,
    }
    np.testing.assert_allclose(dataset["action"], PATH[56], atol=1e-4)  # the second episode's first action
    tmp = recorded["tmp"]
    config = write_config(tmp / "dataset.yaml", tmp / "dataset.jsonl")
    done = user_rl(lerobot_python, recorded["env"], "replay", recorded["dataset"], config, "--episode", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    log = arm_log(tmp / "dataset.jsonl")
    assert len(log) == 10 + 1  # its actions, then the hold
    np.testing.assert_allclose(log[-2]["goal"], PATH[65], atol=1e-4)


def test_replay_plays_the_recorded_actions_in_order_at_the_recorded_rate_and_limits_a_jump(
    recorded: dict, lerobot_python: Path
) -> None:
    tmp = recorded["tmp"]
    config = write_config(tmp / "replay.yaml", tmp / "replay.jsonl")
    done = user_rl(
        lerobot_python,
        recorded["env"],
        "replay",
        recorded["buffer"],
        config,
        "safety.max_action_delta=5",
        "--episode",
        "0",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    log = arm_log(tmp / "replay.jsonl")
    assert len(log) == 30 + 1  # the episode's 30 actions, then the hold
    goals, before = np.array([line["goal"] for line in log[:30]]), np.array([line["position"] for line in log[:30]])
    recorded_actions = np.array(PATH[16:46])
    # the arm starts at 0, 30 degrees from the first recorded goal: each goal is at most 5 from the pose
    assert (np.abs(goals - before) <= 5.0 + 1e-3).all()
    limited = int(np.flatnonzero(~np.isclose(goals, recorded_actions, atol=1e-3).all(axis=1)).max()) + 1
    assert 3 <= limited <= 10, goals
    np.testing.assert_allclose(goals[limited:], recorded_actions[limited:], atol=1e-3)  # then as recorded, in order
    intervals = np.diff([line["t"] for line in log[:30]])
    assert abs(np.median(intervals) - 1 / HZ) < 0.01, intervals
    assert f"replayed 30/30 actions at {HZ} Hz" in done.stderr
    assert f"the safety filter limited {limited} of them (safety.max_action_delta)" in done.stderr


def test_keys_on_stdin_end_episodes_with_success_failure_re_record_and_stop(
    lerobot_python: Path, plugins: tuple[Path, dict[str, str]]
) -> None:
    tmp, env = plugins
    config = write_config(tmp / "keys.yaml", tmp / "keys.jsonl", pad=QUIET_PAD)
    args = [
        "record",
        config,
        "--out",
        tmp / "keys",
        "--episodes",
        "3",
        "--episode-time-s",
        "30",
        "--reset-time-s",
        "0.3",
    ]
    record = subprocess.Popen(
        [str(lerobot_python), "-m", "user_rl.cli", *map(str, args), "--task", TASK],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=lerobot_env.REPO,
        env=env,
    )
    lines: list[str] = []

    def read() -> None:
        for line in record.stderr:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()

    def press(key: str, after: str, times: int = 1) -> None:
        wait_until(lambda: lines.count(after + "\n") >= times or record.poll() is not None, 90, after)
        assert record.poll() is None, "".join(lines)[-3000:]
        time.sleep(0.3)  # a few steps into the episode
        record.stdin.write(key + "\n")
        record.stdin.flush()

    try:
        press("r", "episode 1/3: recording, up to 30 s")
        press("s", "episode 1/3: recording, up to 30 s", times=2)
        press("f", "episode 2/3: recording, up to 30 s")
        press("q", "episode 3/3: recording, up to 30 s")
        assert record.wait(60) == 0, "".join(lines)[-3000:]
    finally:
        record.kill()
    everything = list(read_episodes(tmp / "keys", EpisodeFilter(with_discarded=True)))
    assert [e.end_reason for e in everything] == ["discard", "", "", ""]
    _, success, failure, stopped = everything
    assert success.status == "terminated" and success.steps["label"][-1] == pb.LABEL_SUCCESS
    assert failure.status == "truncated" and failure.steps["label"][-1] == pb.LABEL_FAILURE
    assert stopped.status == "truncated" and (stopped.steps["label"] == pb.LABEL_NONE).all()
    assert all((e.steps["actor"] == pb.ACTOR_HUMAN).all() and len(e) >= 3 for e in everything)
    assert "recorded 3 episodes" in "".join(lines) and "stopped: q pressed" in "".join(lines)


def test_replay_refuses_a_nan_action_and_another_action_space_naming_them_and_sends_nothing(
    recorded: dict, lerobot_python: Path
) -> None:
    tmp = recorded["tmp"]
    space = gym.spaces.Box(-90.0, 90.0, (3,), np.float32)
    actions = np.array(PATH[:10], np.float32)
    actions[3, 1] = np.nan
    write_episode(tmp / "nan", "arm-n", gym.spaces.Dict({"state": space}), space, actions, HZ, task=TASK)
    config = write_config(tmp / "nan.yaml", tmp / "nan.jsonl")
    done = user_rl(lerobot_python, recorded["env"], "replay", tmp / "nan", config, "--episode", "0")
    assert done.returncode == 2 and "the action of step 3 is [" in done.stderr, done.stderr[-3000:]
    assert "nan" in done.stderr and "not finite: refused; nothing was sent to the robot" in done.stderr
    four = write_config(tmp / "four.yaml", tmp / "four.jsonl", joints=4, id="arm_four")
    done = user_rl(lerobot_python, recorded["env"], "replay", recorded["buffer"], four, "--episode", "0")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "cannot play on lerobot-0 (here): the action is float32[3] there and float32[4] here" in done.stderr
    assert arm_log(tmp / "nan.jsonl") == arm_log(tmp / "four.jsonl") == []  # neither arm got a command


def test_a_robot_that_stops_answering_ends_the_recording_in_time_and_keeps_the_finished_episodes(
    lerobot_python: Path, plugins: tuple[Path, dict[str, str]]
) -> None:
    tmp, env = plugins
    config = write_config(
        tmp / "stall.yaml", tmp / "stall.jsonl", fleet={"stall_s": 1.0}, pad=QUIET_PAD, stall_after=25
    )
    args = ["--episodes", "3", "--episode-time-s", "1", "--reset-time-s", "0", "--task", TASK]
    started = time.monotonic()
    done = user_rl(lerobot_python, env, "record", config, "--out", tmp / "stall", *args, timeout=60)
    assert done.returncode == 1, done.stderr[-3000:]
    assert time.monotonic() - started < 50  # not the minute the arm's bus hangs
    assert "did not return within 1 s (fleet.stall_s): the robot stopped answering" in done.stderr
    assert "recorded 1 episode (20 steps at 20 Hz)" in done.stderr, done.stderr
    everything = list(read_episodes(tmp / "stall", EpisodeFilter(with_discarded=True)))
    assert [(len(e), e.end_reason) for e in everything] == [(20, ""), (5, "discard")]
