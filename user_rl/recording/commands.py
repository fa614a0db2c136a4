"""The `user-rl record` and `user-rl replay` commands: their arguments, and the one call each makes."""

from __future__ import annotations

import argparse
import sys

from user_rl.config import load_config


def _record(args: argparse.Namespace) -> int:
    from user_rl.recording.session import record

    cfg = load_config(args.config, args.overrides)
    try:
        summary = record(
            cfg,
            args.out,
            args.episodes,
            args.episode_time_s,
            args.reset_time_s,
            args.task,
            dataset=args.dataset,
            robot_id=args.robot,
            keys=not args.no_keys,
        )
    except (FileExistsError, ValueError, RuntimeError) as exc:  # a buffer of other spaces, a failed export
        print(f"user-rl record: {exc}", file=sys.stderr)
        return 2
    return 1 if summary.failed else 0


def _replay(args: argparse.Namespace) -> int:
    from user_rl.recording.replay import replay

    cfg = load_config(args.config, args.overrides)
    try:
        summary = replay(cfg, args.source, args.episode, robot=args.robot, fps=args.fps)
    except (ValueError, RuntimeError) as exc:  # a NaN action, another action space, no LeRobot for a dataset
        print(f"user-rl replay: {exc}", file=sys.stderr)
        return 2
    return 1 if summary.stopped else 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """`record` and `replay`, as subcommands of `user-rl`."""
    rec = sub.add_parser(
        "record",
        help="people drive the config's robot (a LeRobot teleoperator, the teleop page) and each episode "
        "goes into a buffer (and a LeRobotDataset), like lerobot-record",
    )
    rec.add_argument("config", help="the robot, and who drives it: intervention.teleoperator or teleop.enabled")
    rec.add_argument("overrides", nargs="*", help="key=value overrides, e.g. fleet.control_hz=30")
    rec.add_argument("--out", required=True, help="the buffer directory (made, or appended to)")
    rec.add_argument("--dataset", help="also write the robot's episodes as a LeRobotDataset here at the end (new)")
    rec.add_argument("--episodes", type=int, default=10, help="episodes to keep (default 10)")
    rec.add_argument("--episode-time-s", type=float, default=60.0, help="each episode's length at most (default 60)")
    rec.add_argument(
        "--reset-time-s",
        type=float,
        default=60.0,
        help="after each episode, time to put things back: driven, not recorded (default 60)",
    )
    rec.add_argument("--task", required=True, help="what the person does, e.g. 'put the cube in the bowl'")
    rec.add_argument("--robot", help="the robot's id (default: the config's first, <type>-0)")
    rec.add_argument(
        "--no-keys", action="store_true", help="do not read keys from stdin (s success, f failure, r re-record, q stop)"
    )
    rec.set_defaults(func=_record)

    rep = sub.add_parser(
        "replay",
        help="play one recorded episode's actions on the config's robot through the safety filter, like lerobot-replay",
    )
    rep.add_argument("source", metavar="BUFFER_OR_DATASET", help="a buffer directory or a LeRobotDataset's root")
    rep.add_argument("config", help="the robot to play it on (its first)")
    rep.add_argument("overrides", nargs="*", help="key=value overrides, e.g. safety.max_action_delta=2")
    rep.add_argument("--episode", type=int, required=True, help="which, from 0, in the order buffer export writes them")
    rep.add_argument("--robot", help="whose episode, when the buffer holds several robots'")
    rep.add_argument("--fps", type=float, help="the rate to play at (default: the recorded one)")
    rep.set_defaults(func=_replay)
