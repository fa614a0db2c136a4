"""The live progress line and metrics file: rates since start (a resumed run does not count the
earlier run's steps as new), and the robots' unacknowledged backlog when there is one."""

from __future__ import annotations

import json
from pathlib import Path

from user_rl.progress import ProgressPrinter


def status(env_steps: int, updates: int, backlogs: list[int], **extra) -> dict:
    return {
        "env_steps": env_steps,
        "updates": updates,
        "policy_version": 7,
        "recent_success": 0.5,
        "recent_return": 1.0,
        "robots": {f"r{i}": {"backlog_batches": b} for i, b in enumerate(backlogs)},
        **extra,
    }


def test_resumed_run_rates_count_only_new_work_and_backlog_is_shown(tmp_path: Path) -> None:
    lines: list[str] = []
    printer = ProgressPrinter(tmp_path / "metrics.jsonl", lines.append, every_s=0.0)
    resumed = {"steps_at_start": 10_000, "resumed_from": {"updates": 20_000}}
    printer.progress(2.0, status(10_200, 20_100, [0, 3], **resumed))
    printer.progress(4.0, status(10_400, 20_300, [0, 0], **resumed))
    first, second = (json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert (first["env_steps_per_s"], first["updates_per_s"]) == (100.0, 50.0)
    assert (second["env_steps_per_s"], second["updates_per_s"]) == (100.0, 100.0)
    assert "env   10,200 (   100/s)" in lines[0] and lines[0].endswith("robots 2 | backlog 3 batches")
    assert lines[1].endswith("robots 2")  # nothing waiting: no backlog shown


def test_a_failing_learner_thread_is_printed_under_the_progress_line(tmp_path: Path) -> None:
    lines: list[str] = []
    printer = ProgressPrinter(tmp_path / "metrics.jsonl", lines.append, every_s=0.0)
    printer.progress(1.0, status(100, 50, [0], errors={"checkpointer": "OSError: [Errno 28] No space left on device"}))
    printer.progress(2.0, status(200, 90, [0], errors={}))
    assert lines[1] == "ERROR checkpointer: OSError: [Errno 28] No space left on device"
    assert len(lines) == 3 and not lines[2].startswith("ERROR")  # gone once the thread is healthy again
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["errors"] == {
        "checkpointer": "OSError: [Errno 28] No space left on device"
    }
