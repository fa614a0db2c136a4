"""`user-rl edge`: one robot's edge daemon on a controller outside the Ray cluster (behind NAT,
say). It needs only the learner's address; it behaves exactly like a placed edge (disk spool,
resend after reconnect, weight updates between steps), and on Ctrl-C / SIGTERM it detaches
cleanly: the current step finishes, every spooled batch is delivered, and the learner closes
the robot's open episode.

    user-rl edge configs/lab.yaml --robot arm-left --learner tcp://learner.lab:5555
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from user_rl.config import Config, ConfigError
from user_rl.edge.daemon import RobotRefused
from user_rl.edge.factory import make_edge

Printer = Callable[[str], None]
print_now: Printer = partial(print, flush=True)


def default_spool_root() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "user-rl" / "spool"


def weights_address_for(cfg: Config, learner: str, weights: str | None) -> str:
    """The learner's weights socket: given, or the learner's host with `learner.weights_port`."""
    if weights:
        return weights
    if not cfg.learner.weights_port:
        raise ConfigError(
            "config error: the edge needs the learner's weights address: pass --weights "
            "tcp://HOST:PORT or set learner.weights_port"
        )
    host = learner.removeprefix("tcp://").rpartition(":")[0]
    if not host:
        raise ConfigError(f"config error: --learner must look like tcp://HOST:PORT, got {learner!r}")
    return f"tcp://{host}:{cfg.learner.weights_port}"


def serve_edge(
    cfg: Config,
    robot_id: str,
    learner: str,
    weights: str | None = None,
    spool_root: str | Path | None = None,
    max_steps: int | None = None,
    detach_timeout_s: float = 60.0,
    out: Printer = print_now,
) -> dict:
    """Run one robot until stopped (signal or `max_steps`), then detach; return the final status."""
    weights_address = weights_address_for(cfg, learner, weights)
    spool_root = Path(spool_root) if spool_root else default_spool_root()
    edge = make_edge(cfg, 0, learner, weights_address, spool_root, robot_id=robot_id)
    out(
        f"edge {robot_id} -> {learner} (weights {weights_address}); spool {spool_root / robot_id}",
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: edge.stop())
    stop_progress = threading.Event()
    progress = threading.Thread(target=_report, args=(edge, stop_progress, out), daemon=True)
    progress.start()
    try:
        try:
            edge.run(max_steps=max_steps)
        except RobotRefused as exc:  # e.g. a robot of another model attached to this run's policy
            out(f"edge {robot_id}: {exc}")
            return {**edge.status(), "detached": False}
        stop_progress.set()
        out(f"edge {robot_id}: detaching ({edge.link.unacked} batches to deliver)")
        left = edge.detach(detach_timeout_s)
        status = {**edge.status(), "detached": left}
    finally:
        stop_progress.set()
        edge.close()
    out(
        f"edge {robot_id}: "
        f"{'detached' if status['detached'] else 'stopped without reaching the learner; the spool keeps the data'}"
        f" after {status['steps']} steps ({status['unacked_batches']} batches left in the spool)"
    )
    return status


def _report(edge, stop: threading.Event, out: Printer, every_s: float = 5.0) -> None:
    """Progress every `every_s`; a link problem as soon as it shows (and again when it clears)."""
    last_print, shown_error = time.monotonic(), None
    while not stop.wait(0.5):
        s = edge.status()
        if s["link_error"] != shown_error:
            shown_error = s["link_error"]
            out(
                f"edge {s['robot_id']}: cannot reach the learner: {shown_error}"
                if shown_error
                else f"edge {s['robot_id']}: link to the learner is back"
            )
        if time.monotonic() - last_print >= every_s:
            last_print = time.monotonic()
            problems = [f"{part} failed: {error}" for part, error in s["errors"].items()]
            if s["hold_error"]:
                problems.append(f"{s['safety_violations'].get('hold_failed', 0)} holds failed, last: {s['hold_error']}")
            out(
                f"edge {s['robot_id']}: {s['steps']:,} steps ({s['steps_per_second']:.0f}/s), "
                f"policy v{s['policy_version']}, backlog {s['unacked_batches']} batches"
                + "".join(f"; {p}" for p in problems)
            )
