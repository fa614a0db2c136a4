"""The `user-rl` command: parse, build a config, call one function."""

from __future__ import annotations

import argparse
import json
import sys

from user_rl.config import ConfigError, load_config
from user_rl.extras import missing_extra_message
from user_rl.hal.resources import NODE_LABEL, PlacementError
from user_rl.recording.commands import add_commands as add_record_commands


def _train(args: argparse.Namespace) -> int:
    from user_rl.launch import FleetFailed, train
    from user_rl.launch.training import STOP_SEVERITY

    cfg = load_config(args.config, args.overrides)
    try:
        summary = train(cfg, ray_address=args.address)
    except FleetFailed as exc:  # e.g. every robot refused: a resumed run's policy was made for another arm
        print(f"user-rl: {exc}", file=sys.stderr)
        return 1
    return 0 if summary["stop_reason"] in STOP_SEVERITY else 1


def _learner(args: argparse.Namespace) -> int:
    from user_rl.cloud.standalone import serve_learner

    serve_learner(load_config(args.config, args.overrides), args.run_dir)
    return 0


def _eval(args: argparse.Namespace) -> int:
    from user_rl.evaluation import evaluate_checkpoint

    result = evaluate_checkpoint(args.checkpoint, episodes=args.episodes, seed=args.seed, overrides=args.overrides)
    if args.json:
        print(json.dumps(result))
    else:
        success = "-" if result["success_rate"] is None else f"{result['success_rate']:.2f}"
        print(
            f"policy v{result['policy_version']} on {result['robot']}: success {success}, "
            f"mean return {result['mean_return']:.1f}, mean length {result['mean_length']:.0f} "
            f"over {result['episodes']} episodes"
        )
    return 0


def _buffer_inspect(args: argparse.Namespace) -> int:
    from pathlib import Path

    from user_rl.cloud.buffer.inspect import format_report, inspect_buffer

    report = inspect_buffer(Path(args.directory), verify=not args.no_verify)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["ok"] else 1


def _buffer_export(args: argparse.Namespace) -> int:
    from user_rl.cloud.buffer.episodes import EpisodeFilter
    from user_rl.datasets.lerobot import export_lerobot, print_progress

    which = EpisodeFilter(
        robots=args.robot or None,
        tasks=args.task or None,
        with_interventions=args.with_interventions,
        with_discarded=args.with_discarded,
    )
    try:
        done = export_lerobot(
            args.directory,
            args.out,
            which,
            repo_id=args.repo_id,
            fps=args.fps,
            robot_type=args.robot_type,
            progress=print_progress("exported"),
            video=args.video,
            vcodec=args.vcodec,
        )
    except (FileExistsError, ValueError, RuntimeError) as exc:
        print(f"user-rl buffer export: {exc}", file=sys.stderr)
        return 2
    cameras = f", cameras as {args.vcodec} video" if done["video"] else ""
    frames = f"{done['frames']:,} frames, {done['fps']} fps{cameras}"
    print(f"wrote {done['episodes']:,} episodes ({frames}) to {done['root']}")
    return 0


def _buffer_import(args: argparse.Namespace) -> int:
    from user_rl.datasets.lerobot import print_progress
    from user_rl.datasets.lerobot_import import import_lerobot

    try:
        done = import_lerobot(
            args.dataset,
            args.out,
            repo_id=args.repo_id,
            progress=print_progress("imported"),
            video_backend=args.video_backend,
        )
    except (FileExistsError, ValueError, RuntimeError) as exc:
        print(f"user-rl buffer import: {exc}", file=sys.stderr)
        return 2
    for note in done["notes"]:
        print(f"note: {note}", file=sys.stderr)
    print(
        f"imported {done['episodes']:,} episodes ({done['frames']:,} frames) into {done['buffer']}; use it with "
        f"'buffer.attach=[{{path: {done['buffer']}, source: demo}}]'"
    )
    return 0


def _reward_train(args: argparse.Namespace) -> int:
    from user_rl.rewards.frames import NoLabelledFrames
    from user_rl.rewards.training import train_classifier

    try:
        result = train_classifier(
            args.path,
            args.keys,
            args.out,
            positives=args.positives,
            holdout=args.holdout,
            updates=args.updates,
            threshold=args.threshold,
            seed=args.seed,
            hidden=args.hidden,
        )
    except (NoLabelledFrames, ValueError) as exc:
        print(f"user-rl: {exc}", file=sys.stderr)
        return 2
    print(f"{result.line()}; saved to {result.path}")
    return 0


def _edge(args: argparse.Namespace) -> int:
    from user_rl.edge.standalone import serve_edge

    cfg = load_config(args.config, args.overrides).embodiment(args.embodiment)
    learner, weights = args.learner, args.weights
    if args.run_dir:  # attach to a run on this machine: its addresses are in the run directory
        from pathlib import Path

        run_dir = Path(args.run_dir) / (args.embodiment or "")  # each embodiment has a learner of its own
        path = run_dir / "addresses.json"
        if not path.is_file():
            raise ConfigError(f"config error: {run_dir} holds no addresses.json (is a training running there?)")
        addresses = json.loads(path.read_text())
        learner, weights = addresses["data"], addresses["weights"]
        run_policy = load_config(str(run_dir / "config.yaml"), []).policy
        if run_policy != cfg.policy:  # the edge could not load the learner's weights
            raise ConfigError(
                f"config error: policy: the run trains {run_policy.summary()}, this config says {cfg.policy.summary()}"
            )
    if not learner:
        raise ConfigError("config error: say where the learner is: --learner tcp://HOST:PORT or --run-dir RUN_DIR")
    status = serve_edge(cfg, args.robot, learner, weights, args.spool, args.max_steps)
    return 0 if status["detached"] else 1


def _optional_config(args: argparse.Namespace):
    return load_config(args.config, args.overrides) if args.config else None


def _hal_discover(args: argparse.Namespace) -> int:
    from user_rl.nodes import print_discovery

    return print_discovery(_optional_config(args), args.json, args.sim_slots, probe=not args.no_probe)


def _node_start(args: argparse.Namespace) -> int:
    from user_rl.nodes import start_node

    labels = dict(_key_value(item) for item in args.label)
    return start_node(
        _optional_config(args),
        args.head,
        args.address,
        args.name,
        labels,
        args.sim_slots,
        args.port,
        args.num_cpus,
        args.block,
        args.dry_run,
    )


def _keys(args: argparse.Namespace) -> int:
    from user_rl.security import keys

    if args.action == "generate":
        written = keys.generate(args.directory, args.robots)
        for path in written:
            print(f"wrote {path}")
        print(
            f"{len(written)} files; robots need {args.directory}/learner.key and their robots/<id>.key_secret"
            if written
            else "nothing to do: every key exists (keys are never overwritten)"
        )
    elif args.action == "revoke":
        print(f"revoked {args.robot}: {keys.revoke(args.directory, args.robot)} (a running learner refuses it now)")
    elif args.action == "enroll":
        print(f"enrolled {args.robot}: {keys.enroll(args.directory, args.robot, args.public_key)}")
    return 0


def _estop(args: argparse.Namespace) -> int:
    """Trip or clear the latched emergency stop of robots whose spool is on this machine."""
    import getpass
    from pathlib import Path

    from user_rl.edge.standalone import default_spool_root
    from user_rl.robots.estop import EStopLatch

    root = Path(args.run_dir) / "spool" if args.run_dir else Path(args.spool or default_spool_root())
    robots = sorted(p.name for p in root.iterdir() if p.is_dir()) if args.all and root.is_dir() else args.robots
    if not robots:
        raise ConfigError(
            f"name the robots, or --all (robots under {root}: "
            f"{', '.join(sorted(p.name for p in root.glob('*') if p.is_dir())) or 'none'})"
        )
    user = getpass.getuser()
    for robot_id in robots:
        latch = EStopLatch.for_robot(root, robot_id)
        if args.command == "estop":
            latch.trip(args.reason, source="cli", by=user)
            print(f"{robot_id}: EMERGENCY STOP ({args.reason}); holds until `user-rl rearm {robot_id}`")
            continue
        stop = latch.stop()  # the CLI (a user on the robot's controller) may clear any stop: it says which
        if latch.clear(by=f"cli:{user}"):
            print(f"{robot_id}: re-armed by cli:{user} (cleared the {stop['source']} stop: {stop['reason']})")
        else:
            print(f"{robot_id}: was not stopped")
    return 0


def _teleop(args: argparse.Namespace) -> int:
    from user_rl.edge.teleop.console import serve_console
    from user_rl.edge.teleop.fleet import read_pages

    if args.list:
        pages = [page for target in args.targets for page in read_pages(target)]
        for page in pages:
            print(f"{page.robot_id}  {page.url}")
        return 0 if pages else 1
    if len(args.targets) != 1:
        raise ConfigError("the fleet console serves one run directory or one page address; --list takes several")
    serve_console(args.targets[0], args.host, args.port, url_file=args.url_file)
    return 0


def _status(args: argparse.Namespace) -> int:
    import time

    from user_rl.status import NoStatus, fleet_table, learner_statuses

    while True:
        try:
            statuses = learner_statuses(args.target, args.keys, args.robot, args.timeout)
        except NoStatus as exc:
            print(f"user-rl: {exc}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(dict(statuses), default=str))
        else:
            print(
                "\n\n".join((f"== {name}\n" if name else "") + fleet_table(status) for name, status in statuses),
                flush=True,
            )
        if not args.watch:
            return 0
        time.sleep(args.watch)
        print()


def _plot(args: argparse.Namespace) -> int:
    from user_rl.plots import NothingToPlot, render_run_plots

    try:
        written = render_run_plots(args.run_dir)
    except NothingToPlot as exc:
        print(f"user-rl: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--label takes KEY=VALUE, got {text!r}")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="user-rl", description="Online policy learning on robot fleets.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        aliases=["launch"],
        help="train a policy: place the learner and one edge per "
        "robot on the nodes that own them (launch is the same command)",
    )
    train.add_argument("config", help="YAML config, e.g. configs/reach.yaml")
    train.add_argument("overrides", nargs="*", help="key=value overrides, e.g. fleet.num_robots=2")
    train.add_argument("--address", default=None, help="Ray cluster address (default: a fresh local instance)")
    train.set_defaults(func=_train)

    ev = sub.add_parser("eval", help="evaluate a checkpoint on fresh episodes")
    ev.add_argument("checkpoint")
    ev.add_argument(
        "overrides",
        nargs="*",
        help="key=value changes to the run's config, e.g. robot.options.reward=sparse (the task's sparse variant)",
    )
    ev.add_argument("--episodes", type=int, default=20)
    ev.add_argument("--seed", type=int, default=1, help="evaluation seed set (training evals use the run's seed)")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    ev.set_defaults(func=_eval)

    learner = sub.add_parser("learner", help="run the learner alone (resumes the run directory if it holds one)")
    learner.add_argument("config")
    learner.add_argument("overrides", nargs="*", help="key=value overrides, e.g. learner.data_port=5555")
    learner.add_argument("--run-dir", required=True, help="checkpoint, buffer and status live here")
    learner.set_defaults(func=_learner)

    buffer = sub.add_parser("buffer", help="persistent replay buffer tools")
    actions = buffer.add_subparsers(dest="action", required=True)
    inspect = actions.add_parser(
        "inspect",
        help="summarize a buffer directory and verify its segment checksums "
        "(read-only; exit 1 if a segment is corrupt)",
    )
    inspect.add_argument("directory", help="the buffer directory (holds index.sqlite)")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.add_argument(
        "--no-verify", action="store_true", help="skip the checksums (headers and sizes are still checked)"
    )
    inspect.set_defaults(func=_buffer_inspect)
    export = actions.add_parser(
        "export",
        help="write a slice of a buffer as a dataset another tool loads (LeRobotDataset v3; needs user-rl[lerobot])",
    )
    export.add_argument("directory", help="the buffer directory (holds index.sqlite); read-only")
    export.add_argument("out", help="the dataset directory to create (must not exist)")
    export.add_argument("--format", choices=["lerobot"], default="lerobot")
    export.add_argument("--robot", action="append", help="only this robot's episodes (repeat for more)")
    export.add_argument("--task", action="append", help="only this task's episodes (repeat for more)")
    export.add_argument("--with-interventions", action="store_true", help="only episodes in which someone took over")
    export.add_argument("--with-discarded", action="store_true", help="also episodes a person discarded (re-record)")
    export.add_argument("--fps", type=int, help="the dataset's frame rate (default: the robots' recorded control rate)")
    export.add_argument("--repo-id", default="local/user-rl", help="the dataset's name (nothing is uploaded)")
    export.add_argument("--robot-type", help="recorded in the dataset's info, e.g. so101_follower")
    export.add_argument(
        "--video",
        action="store_true",
        help="cameras as one MP4 each, as lerobot-record writes them (lossy, far smaller); "
        "default: PNG frames (lossless: an import gives back the same pixels)",
    )
    export.add_argument(
        "--vcodec",
        default="libsvtav1",
        help="the codec of --video (LeRobot's: libsvtav1, the default, h264, hevc, auto); "
        "AV1 needs cameras of at least 32 pixels a side",
    )
    export.set_defaults(func=_buffer_export)
    imp = actions.add_parser(
        "import",
        help="a local LeRobotDataset as a new buffer directory, to attach as demonstrations (needs user-rl[lerobot])",
    )
    imp.add_argument("dataset", help="the LeRobotDataset's root directory (meta/info.json inside; no hub)")
    imp.add_argument("out", help="the buffer directory to create")
    imp.add_argument("--repo-id", default="local/user-rl", help="the dataset's name")
    imp.add_argument(
        "--video-backend",
        choices=["torchcodec", "pyav"],
        help="how LeRobot decodes video cameras (default: LeRobot's, torchcodec, which needs FFmpeg's "
        "libraries: apt-get install ffmpeg; pyav brings its own)",
    )
    imp.set_defaults(func=_buffer_import)

    reward = sub.add_parser("reward", help="rewards learned from people: the success classifier")
    reward_actions = reward.add_subparsers(dest="action", required=True)
    rtrain = reward_actions.add_parser(
        "train",
        help="train a success classifier on the labelled frames of a run's "
        "buffer and print its accuracy on held-out episodes",
    )
    rtrain.add_argument("path", help="a run directory (its buffer/) or a buffer directory")
    rtrain.add_argument("--keys", nargs="+", default=["image"], help="observation keys it reads (default: image)")
    rtrain.add_argument("--out", default="classifier.pt", help="where to save it (reward.classifier)")
    rtrain.add_argument(
        "--positives", type=int, default=1, help="the last N frames of a success episode are successes (default 1)"
    )
    rtrain.add_argument("--holdout", type=float, default=0.2, help="share of labelled episodes held out")
    rtrain.add_argument("--updates", type=int, default=1500, help="gradient steps")
    rtrain.add_argument("--threshold", type=float, default=0.5, help="P(success) judged a success")
    rtrain.add_argument(
        "--hidden", type=int, nargs="+", default=None, help="hidden layer sizes of its head (default: 64)"
    )
    rtrain.add_argument("--seed", type=int, default=0)
    rtrain.set_defaults(func=_reward_train)

    for name, text in (
        ("edge", "run one robot's edge daemon outside the Ray cluster (e.g. behind NAT)"),
        ("attach", "add a robot to a running training; Ctrl-C detaches it cleanly"),
    ):
        edge = sub.add_parser(name, help=text)
        edge.add_argument("config")
        if name == "attach":
            edge.add_argument("robot", help="the robot's id (its options come from the config's robot section)")
        else:
            edge.add_argument("--robot", required=True, help="the robot's id")
        edge.add_argument("overrides", nargs="*", help="key=value overrides")
        edge.add_argument("--learner", help="the learner's data address, tcp://HOST:PORT")
        edge.add_argument("--weights", help="the learner's weights address (default: HOST and learner.weights_port)")
        edge.add_argument("--run-dir", help="a training on this machine to attach to (reads its addresses.json)")
        edge.add_argument(
            "--embodiment", help="which of the config's embodiments the robot is (configs with embodiments)"
        )
        edge.add_argument("--spool", help="spool directory (default: ~/.local/state/user-rl/spool)")
        edge.add_argument("--max-steps", type=int, help="detach after this many steps")
        edge.set_defaults(func=_edge)

    keys = sub.add_parser("keys", help="CurveZMQ keys: the learner's, one per robot, and who is enrolled")
    key_actions = keys.add_subparsers(dest="action", required=True)
    generate = key_actions.add_parser(
        "generate", help="make the learner's keypair and one per robot, enrolling new robots (existing keys are kept)"
    )
    generate.add_argument("directory", help="the keys directory (security.keys_dir)")
    generate.add_argument("robots", nargs="*", help="robot ids, e.g. arm-0 arm-1")
    revoke = key_actions.add_parser("revoke", help="refuse a robot's key from now on (no learner restart)")
    revoke.add_argument("directory")
    revoke.add_argument("robot")
    enroll = key_actions.add_parser("enroll", help="accept a robot whose keypair was made on the robot")
    enroll.add_argument("directory")
    enroll.add_argument("robot")
    enroll.add_argument("public_key", help="the robot's public .key file")
    keys.set_defaults(func=_keys)

    for name, text in (
        ("estop", "emergency stop: robots hold and take no step until re-armed (latched, survives edge restarts)"),
        ("rearm", "clear an emergency stop"),
    ):
        stop = sub.add_parser(name, help=text)
        stop.add_argument("robots", nargs="*", help="robot ids")
        stop.add_argument("--all", action="store_true", help="every robot with a spool under the root")
        stop.add_argument("--spool", help="the edges' spool root (default: ~/.local/state/user-rl/spool)")
        stop.add_argument("--run-dir", help="a training on this machine (its spool root is RUN/spool)")
        if name == "estop":
            stop.add_argument("--reason", default="operator emergency stop")
        stop.set_defaults(func=_estop)

    teleop = sub.add_parser(
        "teleop",
        help="the fleet console: every robot's cameras and state, stop-all, and each robot's page "
        "(runs launched with teleop.enabled=true)",
    )
    teleop.add_argument(
        "targets",
        nargs="+",
        metavar="RUN_DIR|ADDRESS",
        help="a run directory, or a robot page's address as its edge printed it (http://HOST:PORT/?token=...)",
    )
    teleop.add_argument("--list", action="store_true", help="print each robot's page address and exit")
    teleop.add_argument("--host", default="127.0.0.1", help="where the console listens")
    teleop.add_argument("--port", type=int, default=0, help="the console's port (default: a free one)")
    teleop.add_argument(
        "--url-file",
        help="the owner-only file the console's address with its token goes to "
        "(default: RUN_DIR/console.url; for a page address, $XDG_STATE_HOME/user-rl/console.url)",
    )
    teleop.set_defaults(func=_teleop)

    status = sub.add_parser(
        "status",
        help="the live fleet table: each robot's health, policy version, steps/s, spool, backlog and last error",
    )
    status.add_argument(
        "target",
        metavar="RUN_DIR|ADDRESS",
        help="a run directory, or a running learner's data address (tcp://host:port)",
    )
    status.add_argument("--keys", help="keys directory, for a learner whose links are encrypted")
    status.add_argument("--robot", default="", help="the enrolled robot whose key asks (with --keys)")
    status.add_argument("--watch", type=float, default=0.0, metavar="S", help="print the table again every S seconds")
    status.add_argument(
        "--timeout", type=float, default=5.0, metavar="S", help="how long to wait for a learner's answer"
    )
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(func=_status)

    plot = sub.add_parser(
        "plot",
        help="draw a run's learning curve and per-robot contribution as PNG files "
        "in its directory (train does this at its end)",
    )
    plot.add_argument("run_dir", help="the run directory")
    plot.set_defaults(func=_plot)

    add_record_commands(sub)

    hal = sub.add_parser("hal", help="the devices of this node")
    hal_actions = hal.add_subparsers(dest="action", required=True)
    discover = hal_actions.add_parser(
        "discover",
        help="list robots (probed), sim slots, GPUs, serial ports, "
        "cameras and LeRobot robot types of this node (exit 1 if a configured robot does not answer)",
    )
    _config_args(discover)
    discover.add_argument("--json", action="store_true", help="print devices and Ray resources as JSON")
    discover.add_argument("--no-probe", action="store_true", help="do not connect to configured robots")
    discover.set_defaults(func=_hal_discover)

    node = sub.add_parser("node", help="Ray nodes that advertise their devices")
    node_actions = node.add_subparsers(dest="action", required=True)
    start = node_actions.add_parser("start", help="start a Ray node whose custom resources are this node's devices")
    _config_args(start)
    role = start.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true", help="start a new cluster's head node")
    role.add_argument("--address", help="join the cluster whose head is at ADDR (HOST:PORT)")
    start.add_argument("--name", help=f"the node's name (label {NODE_LABEL}; default: the host name)")
    start.add_argument("--label", action="append", default=[], help="KEY=VALUE node label (repeatable)")
    start.add_argument("--port", type=int, help="head node port (default: Ray's 6379)")
    start.add_argument("--num-cpus", type=int, help="CPUs to advertise (default: all)")
    start.add_argument("--block", action="store_true", help="stay in the foreground until stopped")
    start.add_argument("--dry-run", action="store_true", help="print the ray start command and exit")
    start.set_defaults(func=_node_start)
    return parser


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="config whose robots this node drives (optional)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--sim-slots", type=int, help="simulator slots to offer (default: the CPU count)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, PlacementError, FileNotFoundError, ConnectionError) as exc:
        print(f"user-rl: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # e.g. `user-rl train` on a robot controller installed without Ray
        message = missing_extra_message(args.command, exc)
        if message is None:
            raise
        print(f"user-rl: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
