"""`user-rl learner`: the learner as its own process, for a GPU box or a restart after a crash.

It binds the configured ports (`learner.data_port`, `learner.weights_port`; fix them so edges
find a restarted learner at the same address), resumes from the run directory's checkpoint
and buffer when they exist, writes `addresses.json` and a `learner_status.json` every second,
and on SIGTERM / SIGINT stops cleanly: final checkpoint, buffer sealed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

from user_rl.cloud.learner import Learner
from user_rl.cloud.threads import GuardedThread
from user_rl.config import Config, dump_config
from user_rl.progress import ProgressPrinter, write_status_json


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
    out(f"learner at {learner.addresses['data']} (weights {learner.addresses['weights']}) trains on "
        f"{learner.device_name}; " + (f"resumed from {resumed}" if resumed else "fresh run"))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    loop = GuardedThread("learner", learner.run)  # keeps why it stopped, for the status and the log
    loop.start()
    printer = ProgressPrinter(run_dir / "metrics.jsonl", out)
    started = time.monotonic()
    while not stop.is_set() and loop.is_alive():
        status = learner.status()
        write_status_json(run_dir / "learner_status.json", {"resumed_from": learner.resumed_from, **status, "pid": os.getpid()})
        printer.progress(time.monotonic() - started, status)
        stop.wait(1.0)
    learner.stop()
    loop.join(timeout=60)
    path = learner.save()
    status = learner.status()
    if loop.error:
        status["errors"] = {**status.get("errors", {}), "learner": loop.error}
        out(f"ERROR learner: {loop.error}")
    learner.close()
    write_status_json(run_dir / "learner_status.json", {**status, "pid": os.getpid(), "stopped": True})
    out(f"learner stopped; checkpoint {path}")
    return status
