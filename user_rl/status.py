"""`user-rl status RUN_DIR | ADDRESS`: the live fleet table of a run.

A run directory holds the status its launch (`fleet_status.json`, every second) or its standalone
learner (`learner_status.json`) writes; an address (`tcp://host:port`, the learner's data port) is
asked over the wire, with a `StatusRequest` any learner answers. Both give one table: each robot's
health, the policy version it acts with, steps/s, what its spool holds, its unacknowledged batches,
the batches the learner refused and quarantined, and the last error its edge reported.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import zmq

from user_rl.cloud.buffer.inspect import format_bytes
from user_rl.cloud.fleet_status import status_from_reply
from user_rl.progress import error_lines
from user_rl.security.curve import ClientKeys
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import WireError, decode, encode, envelope

RUN_FILES = ("fleet_status.json", "learner_status.json")  # a launch's, a standalone learner's


class NoStatus(ValueError):
    """Nothing to show: not a run directory, or no learner answered."""


def read_run_status(run_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """(name, status) of each learner of a run directory: one, or one per embodiment."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NoStatus(f"{run_dir} is not a directory (give a run directory or a learner's tcp:// address)")
    found = [(run_dir, name) for name in RUN_FILES if (run_dir / name).is_file()][:1]
    if not found:
        found = [
            (d, name)
            for d in sorted(p for p in run_dir.iterdir() if p.is_dir())
            for name in RUN_FILES
            if (d / name).is_file()
        ]
    if not found:
        raise NoStatus(
            f"{run_dir} holds no {' or '.join(RUN_FILES)}: is it the run directory of "
            "`user-rl train` or `user-rl learner`?"
        )
    statuses = []
    for directory, name in found:
        path = directory / name
        raw = _read_json(path)
        status = raw if name == "learner_status.json" else {**(raw.get("learner") or {}), "robots": _merge_edges(raw)}
        status["updated_s_ago"] = round(time.time() - path.stat().st_mtime, 1)
        status["finished"] = bool(raw.get("stopped")) or (run_dir / "summary.json").is_file()
        statuses.append(("" if directory == run_dir else directory.name, status))
    return statuses


def _read_json(path: Path, tries: int = 5) -> dict:
    """A status file; one written in place on a full disk (`write_status_json`) may be read half-written:
    read again."""
    for attempt in range(tries):
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            if attempt == tries - 1:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")


def _merge_edges(fleet: dict) -> dict[str, dict]:
    """A launch's view: what the learner has of each robot, and the fleet's word on edges that failed."""
    robots = {rid: dict(row) for rid, row in (fleet.get("learner_robots") or {}).items()}
    for rid, edge in (fleet.get("edges") or {}).items():
        row = robots.setdefault(rid, {"health": "not connected"})
        row["edge_restarts"] = edge.get("restarts", 0)
        if edge.get("failed"):
            row["health"] = f"failed: {edge['failed']}"
    return robots


def ask_learner(address: str, keys: ClientKeys | None = None, robot_id: str = "", timeout_s: float = 5.0) -> dict:
    """The status of the learner whose data link is at `address`, over the wire."""
    context = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    if keys is not None:
        keys.apply(socket)
    try:
        socket.connect(address)
        socket.send_multipart(encode(envelope(robot_id, status_request=pb.StatusRequest())))
        if not socket.poll(int(timeout_s * 1000)):
            raise NoStatus(
                f"no learner answered at {address} within {timeout_s:g} s "
                "(is it running, and is that its data port? keys needed?)"
            )
        msg = decode(socket.recv_multipart(copy=False))
    finally:
        socket.close()
    if msg.kind == "reject":
        raise NoStatus(f"the learner at {address} refused: {msg.body.reason}")
    if msg.kind != "status_reply":
        raise WireError("unexpected", f"{msg.kind} in answer to a status request")
    return status_from_reply(msg.body)


COLUMNS = ("robot", "health", "policy", "lag", "steps/s", "spool", "backlog", "stored", "quarantined", "last error")


def fleet_table(status: dict[str, Any]) -> str:
    """The run's counters on one line, then one row per robot."""
    head = (
        f"env steps {status.get('env_steps') or 0:,} | updates {status.get('updates') or 0:,} | "
        f"policy v{status.get('policy_version', -1)} | buffer {status.get('buffer') or 0:,}"
    )
    if "updated_s_ago" in status:
        head += " | finished" if status.get("finished") else f" | updated {status['updated_s_ago']:g} s ago"
    head = "\n".join([head, *error_lines(status)])  # why the learner is failing (e.g. a full disk), before the rows
    rows = [COLUMNS]
    for robot_id, robot in sorted((status.get("robots") or {}).items()):
        acting, lag = robot.get("acting_version"), robot.get("policy_lag")
        rows.append(
            (
                robot_id,
                robot.get("health") or "unknown",
                "-" if acting is None or acting < 0 else f"v{acting}",
                "-" if lag is None else str(lag),
                f"{robot.get('steps_per_second') or 0.0:.1f}",
                format_bytes(robot.get("backlog_bytes") or 0),
                str(robot.get("backlog_batches") or 0),
                f"{robot.get('transitions') or 0:,}",
                str(robot.get("quarantined_batches") or 0),
                robot.get("last_error") or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1] for row in rows]
    if len(rows) == 1:
        lines.append("(no robot has connected)")
    lines += [
        f"{robot_id} re-armed {robot['rearmed']}"
        for robot_id, robot in sorted((status.get("robots") or {}).items())
        if robot.get("rearmed")
    ]  # who cleared its last emergency stop (docs/safety.md)
    return "\n".join([head, *lines])


def learner_statuses(
    target: str, keys_dir: str | None = None, robot_id: str = "", timeout_s: float = 5.0
) -> list[tuple[str, dict]]:
    """The status of a run directory's learners, or of the learner at a tcp:// address."""
    if target.startswith("tcp://"):
        if keys_dir and not robot_id:
            raise NoStatus("--keys needs --robot: the enrolled robot whose key asks")
        keys = ClientKeys.for_robot(keys_dir, robot_id) if keys_dir else None
        return [("", ask_learner(target, keys, robot_id, timeout_s))]
    return read_run_status(Path(target))
