"""Live progress lines, the metrics file, and the end-of-run summary."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


# What a status written over the old one in place keeps when the whole one does not fit in its blocks.
BRIEF_KEYS = ("time", "env_steps", "updates", "policy_version", "buffer", "failure", "errors", "pid", "stopped")


def write_status_json(path: Path, data: dict) -> None:
    """Replace a status file atomically, so a reader (a script, a test) never sees half of it.

    On a full disk there is no room for the new file: the status is then written over the old one, in
    the blocks that file already holds (whole, else its BRIEF_KEYS), with why under
    `errors["status_file"]`, so `user-rl status` shows the reason instead of a stale file. OSError
    only when not even that fits; no temporary file is left behind either way."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(data, default=str))
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        errors = {**(data.get("errors") or {}), "status_file": f"{path.name}: {exc.strerror or exc}; written in place"}
        marked = {**data, "errors": errors}
        if not (_overwrite(path, marked) or _overwrite(path, {k: marked[k] for k in BRIEF_KEYS if k in marked})):
            raise


def _overwrite(path: Path, data: dict) -> bool:
    """Write `data` over the file in place, padded with spaces (JSON ignores them) to its size, if it fits."""
    text = json.dumps(data, default=str).encode()
    try:
        size = path.stat().st_size
        if len(text) > size:
            return False
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, text.ljust(size), 0)
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def error_lines(status: dict) -> list[str]:
    """`ERROR <thread>: <why>` for every learner thread that stopped or is failing."""
    return [f"ERROR {name}: {why}" for name, why in sorted((status.get("errors") or {}).items())]


def _backlog(status: dict) -> str:
    """Batches the robots hold unacknowledged (from their heartbeats): a slow or broken uplink shows here."""
    waiting = sum(r.get("backlog_batches", 0) for r in status.get("robots", {}).values())
    return f" | backlog {waiting:,} batches" if waiting else ""


def _interventions(status: dict) -> str:
    rate = status.get("intervention_rate") or 0.0
    return f" | interventions {rate:.2f}" if rate else ""


class ProgressPrinter:
    def __init__(self, metrics_path: Path, out: Callable[[str], None], every_s: float = 5.0) -> None:
        self.metrics = metrics_path.open("a")
        self.out = out
        self.every_s = every_s
        self._last_print = -1e9
        self._last: tuple[float, int, int] | None = None
        self.write_error: str | None = None  # why the last metrics line could not be written

    def progress(self, elapsed: float, status: dict) -> None:
        if self._last is None:  # a resumed learner starts with the earlier run's steps and updates
            self._last = (0.0, status.get("steps_at_start", 0), (status.get("resumed_from") or {}).get("updates", 0))
        t0, steps0, updates0 = self._last
        dt = max(elapsed - t0, 1e-9)
        steps_rate = (status["env_steps"] - steps0) / dt
        update_rate = (status["updates"] - updates0) / dt
        self._last = (elapsed, status["env_steps"], status["updates"])
        record = {
            "time_s": round(elapsed, 2),
            "env_steps_per_s": round(steps_rate, 1),
            "updates_per_s": round(update_rate, 1),
            **{k: v for k, v in status.items() if k not in ("robots", "error")},
            # each robot's stored transitions: the end-of-run plot of who contributed what
            "robot_transitions": {rid: r.get("transitions", 0) for rid, r in status.get("robots", {}).items()},
        }
        self._record(record)
        if elapsed - self._last_print >= self.every_s:
            self._last_print = elapsed
            self.out(
                f"[{elapsed:6.0f}s] env {status['env_steps']:>8,} ({steps_rate:6.0f}/s) | "
                f"updates {status['updates']:>8,} ({update_rate:5.0f}/s) | policy v{status['policy_version']} | "
                f"success {_fmt(status.get('recent_success'))} | return {_fmt(status.get('recent_return'), '.1f')} | "
                f"robots {len(status.get('robots', {}))}{_interventions(status)}{_backlog(status)}"
            )
            for line in error_lines(status):
                self.out(line)

    def _record(self, record: dict) -> None:
        """One line of metrics.jsonl; a full disk loses lines, never the process that writes them."""
        try:
            self.metrics.write(json.dumps(record, default=str) + "\n")
            self.metrics.flush()
        except OSError as exc:
            if not self.write_error:
                self.out(f"ERROR metrics: {self.metrics.name}: {exc.strerror or exc} (lines are lost until it clears)")
            self.write_error = f"{exc.strerror or exc}"
        else:
            self.write_error = None

    def evaluation(self, record: dict) -> None:
        self._record({"eval": record})
        went_on = _updates_meanwhile(record)
        self.out(
            f"[{record['time_s']:6.0f}s] eval of policy v{record['policy_version']}: "
            f"success {_fmt(record['success_rate'])}, return {record['mean_return']:.1f} "
            f"over {record['episodes']} episodes" + (f" (training went on: +{went_on:,} updates)" if went_on else "")
        )

    @staticmethod
    def print_summary(summary: dict, out: Callable[[str], None]) -> None:
        wall = max(summary.get("wall_s", 0.0), 1e-9)
        out("")
        out(f"run finished ({summary['stop_reason']}) in {summary['wall_s']:.0f}s: {summary['run_dir']}")
        if summary.get("goal_reached_s") is not None:
            out(f"  goal reached after {summary['goal_reached_s']:.0f}s")
        embodiments = summary.get("embodiments") or {"": summary}
        for name, fleet in embodiments.items():
            if name:
                out(f"embodiment {name} ({fleet['stop_reason']}):")
            _print_fleet(fleet, wall, out)


def _print_fleet(fleet: dict, wall: float, out: Callable[[str], None]) -> None:
    """One policy's part of the summary: its learner, final evaluation, robots and checkpoint."""
    learner = fleet.get("learner", {})
    final = fleet.get("final_eval") or {}
    out(
        f"  env steps {learner.get('env_steps', 0):,} ({learner.get('env_steps', 0) / wall:.0f}/s), "
        f"updates {learner.get('updates', 0):,} ({learner.get('updates', 0) / wall:.0f}/s), "
        f"policy versions {learner.get('policy_version', 0)}"
    )
    if final:
        out(
            f"  final eval (policy v{final['policy_version']}): success {_fmt(final['success_rate'])}, "
            f"return {final['mean_return']:.1f} over {final['episodes']} episodes"
        )
    for robot_id, robot in sorted(learner.get("robots", {}).items()):
        out(
            f"  {robot_id}: {robot['transitions']:,} transitions, {robot['episodes']} episodes, "
            f"{robot['policy_versions']} policy versions"
        )
    rejected = learner.get("rejected") or {}
    if rejected:
        out(f"  rejected messages: {rejected}")
    out(f"  checkpoint: {fleet.get('checkpoint')}")


def _updates_meanwhile(record: dict) -> int:
    """Updates the learner made while an evaluation ran beside the training (0: it was paused)."""
    return max(0, (record.get("updates_after") or 0) - (record.get("updates") or 0))
