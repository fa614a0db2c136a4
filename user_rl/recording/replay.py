"""`user-rl replay`: one recorded episode's actions, played back on a robot (LeRobot's `lerobot-replay`).

    user-rl replay demos/buffer --episode 3 configs/arm.yaml          # a buffer directory
    user-rl replay demos/lerobot --episode 3 configs/arm.yaml         # a LeRobotDataset (LeRobot's env)

The episode is checked before the robot is touched: every action must be finite (a NaN is refused,
naming its step) and the action space must be the robot's (the difference is named). Then the
actions go out at the recorded rate, each through the safety filter every action passes on its way
to a robot: for an arm of absolute position goals each goal stays within the per-step limit of the
current pose (`safety.max_action_delta`, by default the calibrated range in 2 s), so a first goal
far from where the arm stands is approached step by step, not jumped to. Whatever ends the replay
(its last action, Ctrl-C, an error, an e-stop) the robot is told to hold; a robot that stops
answering a step (`fleet.stall_s`) ends it with an error that says so.

`--episode K` counts from 0 in the order `buffer export` writes episodes (discarded ones left out,
one robot: `--robot` when the buffer holds several), so episode K of a buffer is episode K of its
export; in a dataset it is the dataset's episode_index.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np

from user_rl.cloud.buffer.episodes import EpisodeFilter, buffer_spaces, read_episodes, recorded_rates
from user_rl.config import Config, ConfigError
from user_rl.edge.standalone import default_spool_root
from user_rl.hal.registry import make_robot
from user_rl.hal.robot import Robot
from user_rl.recording.driving import (
    RobotStalled,
    RobotThread,
    Ticker,
    ended,
    filtered_step,
    let_go,
    say_on_stderr,
    stopped_by_signals,
)
from user_rl.robots.estop import EStopLatch
from user_rl.robots.safety import ActionFilter, SafetySettings
from user_rl.wire.spaces import space_differences, spaces_from_text

Say = Callable[[str], None]
PROGRESS_S = 1.0


@dataclass(frozen=True)
class RecordedEpisode:
    """One episode's actions as recorded, and what is needed to play them back."""

    actions: np.ndarray  # (steps, *action shape)
    fps: float  # the recorded rate (0: unknown)
    action_space: gym.spaces.Box | None  # None: the source has no exact bounds (a dataset LeRobot recorded)
    action_names: list[str] | None  # a dataset's names of the action's entries, if it has them
    name: str  # which episode, for messages


@dataclass
class ReplaySummary:
    steps: int  # actions sent
    of: int  # actions recorded
    fps: float
    seconds: float
    stopped: str = ""  # why it stopped before the last action ("" if it did not)
    safety: dict[str, int] = field(default_factory=dict)  # the safety filter's interventions by kind
    late_steps: int = 0


class ReplayRefused(ValueError):
    """The episode cannot be played on this robot (a NaN action, another action space)."""


def load_episode(source: str | Path, episode: int, robot: str | None = None) -> RecordedEpisode:
    """Episode `episode` of a buffer directory or a LeRobotDataset at `source`."""
    source = Path(source)
    if episode < 0:
        raise ConfigError(f"replay: --episode counts from 0, got {episode}")
    if (source / "index.sqlite").is_file():
        return _buffer_episode(source, episode, robot)
    if (source / "meta" / "info.json").is_file():
        return _dataset_episode(source, episode)
    raise FileNotFoundError(
        f"{source}: neither a buffer directory (index.sqlite) nor a LeRobotDataset (meta/info.json)"
    )


def _buffer_episode(directory: Path, episode: int, robot: str | None) -> RecordedEpisode:
    rates = recorded_rates(directory)
    if robot is None:
        if len(rates) != 1:
            robots = ", ".join(sorted(rates)) or "no robot"
            raise ConfigError(f"replay: {directory} holds episodes of {robots}: say whose with --robot")
        (robot,) = rates
    elif robot not in rates:
        raise ConfigError(f"replay: {directory} holds no episode of {robot}; it has {', '.join(sorted(rates))}")
    found, count = None, 0
    for found in read_episodes(directory, EpisodeFilter(robots=[robot])):
        if count == episode:
            break
        count, found = count + 1, None
    if found is None:
        raise ConfigError(f"replay: {directory} holds {count} episodes of {robot} (from 0); no {episode}")
    name = f"episode {episode} of {robot} in {directory} (epoch {found.epoch}, number {found.number})"
    return RecordedEpisode(found.steps["action"], rates[robot], buffer_spaces(directory)[1], None, name)


def _dataset_episode(root: Path, episode: int) -> RecordedEpisode:
    """A dataset's episode through LeRobot's own loader (in the LeRobot environment)."""
    from user_rl.datasets.lerobot import SIDECAR, require_lerobot

    LeRobotDataset = require_lerobot()
    dataset = LeRobotDataset("local/replay", root=root)
    total = dataset.meta.total_episodes
    if episode >= total:
        raise ConfigError(f"replay: {root} holds {total} episodes (0 to {total - 1}); no {episode}")
    bounds = dataset.meta.episodes[episode]
    start, stop = int(bounds["dataset_from_index"]), int(bounds["dataset_to_index"])
    rows = dataset.hf_dataset.select_columns(["action"])[start:stop]["action"]  # no image is decoded
    actions = np.stack([np.asarray(a, np.float32) for a in rows])
    sidecar = root / SIDECAR
    space = spaces_from_text({"hello_hex": json.loads(sidecar.read_text())["spaces"]})[1] if sidecar.is_file() else None
    names = dataset.features["action"].get("names")
    flat = list(names) if isinstance(names, list) and all(isinstance(n, str) for n in names) else None
    return RecordedEpisode(actions, float(dataset.fps), space, flat, f"episode {episode} of {root}")


def check_actions(recorded: RecordedEpisode) -> None:
    """Refuse an episode with a NaN or inf action, naming the first such step: nothing is sent."""
    bad = np.flatnonzero(~np.isfinite(recorded.actions.reshape(len(recorded.actions), -1)).all(axis=1))
    if len(bad):
        more = f" (and {len(bad) - 1} more steps)" if len(bad) > 1 else ""
        raise ReplayRefused(
            f"{recorded.name}: the action of step {bad[0]} is {recorded.actions[bad[0]].tolist()}, not finite{more}: "
            "refused; nothing was sent to the robot"
        )


def check_action_space(recorded: RecordedEpisode, robot: Robot) -> list[str]:
    """Refuse actions recorded for another action space (named); notes on bounds that differ."""
    space = robot.action_space
    names = getattr(robot, "action_names", None)
    if recorded.action_names is not None and names is not None and list(names) != recorded.action_names:
        raise ReplayRefused(
            f"{recorded.name}: its actions are {recorded.action_names}, {robot.descriptor.id}'s are {list(names)}"
        )
    there = recorded.action_space or gym.spaces.Box(-np.inf, np.inf, recorded.actions.shape[1:], np.float32)
    empty = gym.spaces.Dict({})
    layout, bounds = space_differences((empty, there), (empty, space))
    if layout:
        raise ReplayRefused(f"{recorded.name} (there) cannot play on {robot.descriptor.id} (here): {'; '.join(layout)}")
    if recorded.action_space is None:
        return []
    return [f"{b}: the safety filter keeps actions inside {robot.descriptor.id}'s bounds" for b in bounds]


def replay(
    cfg: Config,
    source: str | Path,
    episode: int,
    robot: str | None = None,
    fps: float | None = None,
    say: Say = say_on_stderr,
) -> ReplaySummary:
    """Play episode `episode` of `source` on the config's robot (its first) at the recorded rate."""
    recorded = load_episode(source, episode, robot)
    check_actions(recorded)
    hz = fps or recorded.fps or cfg.fleet.control_hz
    if hz <= 0:
        raise ConfigError(f"replay: {recorded.name} has no recorded rate: give it with --fps")
    options = cfg.robot_options(0)
    robot_id = options["robot_id"]
    estop = EStopLatch.for_robot(default_spool_root(), robot_id)
    if stop := estop.tripped():
        raise ConfigError(f"replay: {robot_id} is emergency-stopped ({stop}); `user-rl rearm {robot_id}` clears it")
    calls = RobotThread(cfg.fleet.stall_s, robot_id)
    machine = calls.build(make_robot, cfg.robot.type, **options)
    try:
        for note in check_action_space(recorded, machine):
            say(f"note: {note}")
        safety = ActionFilter(
            machine.action_space, SafetySettings(max_action_delta=cfg.safety.max_action_delta), machine, hz
        )
        say(f"replaying {recorded.name} on {robot_id}: {len(recorded.actions)} actions at {hz:g} Hz")
        interrupted = threading.Event()
        with stopped_by_signals(interrupted.set, "stopping the replay: the robot holds (Ctrl-C again: at once)", say):
            summary = _play(recorded, machine, calls, safety, hz, estop, interrupted, say)
    finally:
        let_go(calls, machine, say)
    limited = summary.safety.get("rate_limited", 0)
    say(
        f"replayed {summary.steps}/{summary.of} actions at {hz:g} Hz in {summary.seconds:.1f} s"
        + (f"; the safety filter limited {limited} of them (safety.max_action_delta)" if limited else "")
        + (f"; stopped: {summary.stopped}" if summary.stopped else "")
    )
    return summary


def _play(
    recorded: RecordedEpisode,
    robot: Robot,
    calls: RobotThread,
    safety: ActionFilter,
    hz: float,
    estop: EStopLatch,
    interrupted: threading.Event,
    say: Say,
) -> ReplaySummary:
    """The actions through the safety filter, one per tick; stops at Ctrl-C, an e-stop or the robot's end."""
    actions, total = recorded.actions, len(recorded.actions)
    obs = calls.call(robot.reset)
    ticker, started, said, stopped, sent = Ticker(hz), time.monotonic(), time.monotonic(), "", 0
    for i, action in enumerate(actions):
        if interrupted.is_set():
            stopped = "interrupted (Ctrl-C)"
        elif stop := estop.tripped():
            stopped = f"emergency stop ({stop})"
        if stopped:
            break
        try:
            result = calls.call(filtered_step, robot, safety, action, obs)
        except RobotStalled as exc:
            stopped = str(exc)
            break
        sent, obs = i + 1, result.observation
        if ended(result, robot) and sent < total:
            stopped = f"the robot ended its episode after {sent} steps"
            break
        if time.monotonic() - said >= PROGRESS_S:
            said = time.monotonic()
            say(f"replay: step {sent}/{total}, {(total - sent) / hz:.1f} s left")
        ticker.wait()
    return ReplaySummary(sent, total, hz, time.monotonic() - started, stopped, dict(safety.violations), ticker.late)
