"""`user-rl learner`: the learner as its own process, for a GPU box or a restart after a crash.

It binds the configured ports (`learner.data_port`, `learner.weights_port`; fix them so edges
find a restarted learner at the same address), resumes from the run directory's checkpoint
and buffer when they exist, writes `addresses.json` and a `learner_status.json` every second,
and on SIGTERM / SIGINT stops cleanly: final checkpoint, buffer sealed.

A full disk stops the buffer taking data (nothing is acked after a failed write; edges keep their
spools); the learner keeps serving and says why in its status, and once the disk has room again it
restarts itself in process on the same addresses, as an operator would: acks resume.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from user_rl.cloud.learner import Learner
from user_rl.cloud.threads import GuardedThread
from user_rl.config import Config, dump_config
from user_rl.progress import ProgressPrinter, write_status_json

log = logging.getLogger(__name__)
RESUME_FREE_BYTES = 64 << 20  # after a full disk, this much free (or a tenth of a smaller disk) resumes the learner


def _print_now(line: str) -> None:
    print(line, flush=True)  # a service's log is a file: each line must be there even if it is killed


def serve_learner(cfg: Config, run_dir: str | Path, out: Callable[[str], None] = _print_now) -> dict:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "config.yaml").exists():
        (run_dir / "config.yaml").write_text(dump_config(cfg))
    learner = Learner(cfg, run_dir)
    write_status_json(run_dir / "addresses.json", learner.addresses)
    resumed = learner.resumed_from
    out(
        f"learner at {learner.addresses['data']} (weights {learner.addresses['weights']}) trains on "
        f"{learner.device_name}; " + (f"resumed from {resumed}" if resumed else "fresh run")
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    loop = GuardedThread("learner", learner.run)  # keeps why it stopped, for the status and the log
    loop.start()
    printer = ProgressPrinter(run_dir / "metrics.jsonl", out)
    started = time.monotonic()
    while not stop.is_set() and loop.is_alive():
        status = learner.status()
        _write_status(run_dir, {"resumed_from": learner.resumed_from, **status, "pid": os.getpid()})
        printer.progress(time.monotonic() - started, status)
        if room_for(learner, status):
            learner, loop = _restart(learner, loop, out)
        stop.wait(1.0)
    learner.stop()
    loop.join(timeout=60)
    path = learner.save()
    status = learner.status()
    if loop.error:
        status["errors"] = {**status.get("errors", {}), "learner": loop.error}
        out(f"ERROR learner: {loop.error}")
    learner.close()
    _write_status(run_dir, {**status, "pid": os.getpid(), "stopped": True})
    out(f"learner stopped; checkpoint {path}")
    return status


def _write_status(run_dir: Path, status: dict) -> None:
    """`learner_status.json`; a disk too full for even the brief status loses this one, never the learner."""
    try:
        write_status_json(run_dir / "learner_status.json", status)
    except OSError as exc:
        log.error("cannot write %s: %s", run_dir / "learner_status.json", exc)


def room_again(directory: Path) -> bool:
    """Whether a disk that filled up has room again: RESUME_FREE_BYTES free, or a tenth of a smaller disk."""
    usage = shutil.disk_usage(directory)
    return usage.free >= min(RESUME_FREE_BYTES, usage.total // 10)


def room_for(learner: Learner, status: dict) -> bool:
    """Whether a learner whose buffer failed to write (`status["failure"]`) has room on its disk again."""
    return bool(status.get("failure")) and room_again(learner.run_dir / "buffer")


def reopened(learner: Learner) -> Learner:
    """A learner stopped after its buffer failed to write, started again once the disk has room: what an
    operator would do, in process: final checkpoint, close, a new learner on the same addresses (its
    buffer recovers what was committed; edges resend the rest from their spools)."""
    try:
        learner.save()
    except OSError as exc:  # the room went again: the restart resumes from the last checkpoint
        log.error("no final checkpoint before the restart: %s", exc)
    learner.close()
    ports = {name: int(learner.addresses[name].rsplit(":", 1)[1]) for name in ("data", "weights")}
    same_addresses = learner.cfg.learner.model_copy(  # the edges' addresses stay valid
        update={"data_port": ports["data"], "weights_port": ports["weights"]}
    )
    return Learner(learner.cfg.model_copy(update={"learner": same_addresses}), learner.run_dir)


def _restart(learner: Learner, loop: GuardedThread, out: Callable[[str], None]) -> tuple[Learner, GuardedThread]:
    """Stop the learner whose disk has room again and start it on its buffer (`reopened`)."""
    reason = learner.status().get("failure")
    learner.stop()
    loop.join(timeout=60)
    learner = reopened(learner)
    out(f"the disk has room again: learner restarted on its buffer (was: {reason})")
    loop = GuardedThread("learner", learner.run)
    loop.start()
    return learner, loop
