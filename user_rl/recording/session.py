"""`user-rl record` put together: the robot, who drives it (a LeRobot teleoperator, the teleop page,
the terminal's keys), the buffer writer and the safety filter, handed to the `Recorder`
(`record.py`); the signals that stop it; the dataset written at the end."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from user_rl.config import Config, ConfigError
from user_rl.edge.factory import intervention_sources
from user_rl.edge.jitter import prepare_control_loop_process
from user_rl.edge.operator import OperatorRequests
from user_rl.edge.standalone import default_spool_root
from user_rl.hal.registry import make_robot
from user_rl.hal.robot import Robot
from user_rl.recording.driving import (
    RobotThread,
    let_go,
    say_on_stderr,
    stopped_by_signals,
)
from user_rl.recording.keys import HELP, TerminalKeys
from user_rl.recording.record import Recorder, RecordSettings, RecordSummary, Say
from user_rl.recording.writer import EpisodeWriter
from user_rl.rewards import make_reward
from user_rl.robots.estop import EStopLatch
from user_rl.robots.safety import ActionFilter, SafetySettings

log = logging.getLogger(__name__)


def record(
    cfg: Config,
    out: str | Path,
    episodes: int,
    episode_time_s: float,
    reset_time_s: float,
    task: str,
    dataset: str | Path | None = None,
    robot_id: str | None = None,
    keys: bool = True,
    say: Say = say_on_stderr,
) -> RecordSummary:
    """Record `episodes` episodes of the config's robot (its first, or `robot_id`) into the buffer at
    `out`; with `dataset`, export them as a LeRobotDataset there at the end."""
    if episodes < 1 or episode_time_s <= 0 or reset_time_s < 0:
        raise ConfigError("record: --episodes must be 1 or more, --episode-time-s above 0, --reset-time-s 0 or more")
    if not task.strip():
        raise ConfigError("record: say what the person does: --task 'pick up the cube'")
    if dataset is not None:
        _check_dataset_target(Path(dataset))
    options = cfg.robot_options(0)
    if robot_id:
        options["robot_id"] = robot_id
    robot_id = options["robot_id"]
    calls = RobotThread(cfg.fleet.stall_s, robot_id)
    robot = calls.build(make_robot, cfg.robot.type, **options)
    closing: list[Callable[[], None]] = []
    try:
        hz = cfg.fleet.control_hz or robot.control_hz
        _check_rate(hz, robot, dataset)
        settings = RecordSettings(episodes, episode_time_s, reset_time_s, task, hz)
        requests = OperatorRequests()
        driving = cfg.intervention.model_copy(update={"teleoperator_drives": "always"})  # no policy to take over from
        interventions, page = intervention_sources(cfg.model_copy(update={"intervention": driving}), robot, requests)
        closing.append(interventions.close)
        if not interventions.sources:
            raise ConfigError(
                "record: nobody can drive the robot: configure intervention.teleoperator (a LeRobot teleoperator) "
                "or teleop.enabled=true (the teleop page)"
            )
        writer = EpisodeWriter(
            out, robot_id, robot.observation_space, robot.action_space, task, hz, batch_rows=max(1, round(hz))
        )
        closing.append(writer.close)
        recorder = Recorder(
            robot,
            calls,
            interventions,
            requests,
            writer,
            settings,
            ActionFilter(robot.action_space, SafetySettings(max_action_delta=cfg.safety.max_action_delta), robot, hz),
            make_reward(cfg.reward.type, robot.observation_space, **cfg.reward.options()),
            EStopLatch.for_robot(default_spool_root(), robot_id),
            say,
        )
        if page is not None:
            from user_rl.edge.teleop import start_server

            recorder.teleop = start_server(recorder, page, cfg.teleop)
            closing.append(recorder.teleop.close)
        if keys:
            TerminalKeys(requests, recorder.quit, say).start()
            say(HELP)
        say(
            f"recording {episodes} episodes of {robot_id} at {hz:g} Hz into {out} (task: {task}); "
            f"Ctrl-C stops (the episode in progress is discarded)"
        )
        prepare_control_loop_process()
        stopping = "stopping: the episode in progress is discarded, finished ones are kept (Ctrl-C again: at once)"
        with stopped_by_signals(recorder.interrupt, stopping, say):
            summary = recorder.run()
    finally:
        for close in reversed(closing):
            try:
                close()
            except Exception:
                log.exception("closing the recording failed")
        let_go(calls, robot, say)
    say(_summary_line(summary))
    if dataset is not None and summary.kept:
        _export(summary, Path(out), Path(dataset), robot_id, robot, say)
    return summary


def _check_dataset_target(dataset: Path) -> None:
    """Before recording: the dataset directory is new and LeRobot is there to write it."""
    from user_rl.datasets.lerobot import require_lerobot

    if dataset.exists():
        raise ConfigError(f"record: {dataset} exists; --dataset names a new directory")
    try:
        require_lerobot()
    except RuntimeError as exc:
        raise ConfigError(f"record --dataset: {exc}") from None


def _check_rate(hz: float, robot: Robot, dataset: str | Path | None) -> None:
    if hz <= 0:
        raise ConfigError(
            f"record: {robot.descriptor.id} has no control rate: set fleet.control_hz (the recording's frame rate)"
        )
    if dataset is not None and hz != round(hz):
        raise ConfigError(f"record --dataset: a LeRobot dataset's fps is a whole number; the robot runs at {hz:g} Hz")


def _summary_line(s: RecordSummary) -> str:
    late = f"; {_count(s.late_steps, 'step')} came late (the robot or the loop was slower than {s.control_hz:g} Hz)"
    return (
        f"recorded {_count(s.kept, 'episode')} ({s.steps} steps at {s.control_hz:g} Hz) into {s.buffer}"
        + (f"; {s.discarded} discarded" if s.discarded else "")
        + (f"; stopped: {s.stopped}" if s.stopped else "")
        + (late if s.late_steps else "")
    )


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def _export(summary: RecordSummary, buffer: Path, dataset: Path, robot_id: str, robot: Robot, say: Say) -> None:
    from user_rl.cloud.buffer.episodes import EpisodeFilter
    from user_rl.datasets.lerobot import export_lerobot, print_progress

    done = export_lerobot(
        buffer,
        dataset,
        EpisodeFilter(robots=[robot_id]),
        fps=round(summary.control_hz),
        robot_type=getattr(robot, "lerobot_type", None) or robot.descriptor.model,
        progress=print_progress("exported"),
    )
    say(f"wrote {done['episodes']} episodes ({done['frames']} frames, {done['fps']} fps) to {done['root']}")
