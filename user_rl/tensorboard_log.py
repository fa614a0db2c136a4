"""TensorBoard logs of a run, as a lab watches one: `tensorboard --logdir RUN_DIR`.

The learner writes what only it sees (losses, the rollouts' returns and success, throughput per
robot, buffer size, how stale the stored data is, how often people intervene) every
`learner.tensorboard_every_s`; `user-rl train` adds its evaluations to the same directory. Every
point is stepped by env steps, the x-axis of an RL curve (TensorBoard shows wall time too).

The writer is torch's `SummaryWriter`, which needs the `tensorboard` package (in the `cluster`
extra): without it the learner says so once and trains on without logs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

LOG_DIR = "tensorboard"  # inside a run directory (each embodiment's, in a heterogeneous run)


class TensorBoardLog:
    """Scalars and histograms into one event file of `log_dir` (files of other writers sit beside it)."""

    def __init__(self, log_dir: Path, suffix: str = "") -> None:
        from torch.utils.tensorboard import SummaryWriter  # ImportError without the tensorboard package

        self.writer = SummaryWriter(str(log_dir), filename_suffix=suffix, flush_secs=10)

    def scalars(self, step: int, values: Mapping[str, float | None]) -> None:
        for tag, value in values.items():
            if value is not None and np.isfinite(value):
                self.writer.add_scalar(tag, float(value), step)

    def counts(self, tag: str, step: int, counts: np.ndarray) -> None:
        """A histogram of integers: `counts[k]` observations of value k."""
        total = int(counts.sum())
        if total == 0:
            return
        values = np.arange(len(counts), dtype=np.float64)
        present = np.flatnonzero(counts)
        self.writer.add_histogram_raw(
            tag,
            min=float(present[0]),
            max=float(present[-1]),
            num=total,
            sum=float((values * counts).sum()),
            sum_squares=float((values**2 * counts).sum()),
            bucket_limits=(values + 0.5).tolist(),
            bucket_counts=counts.astype(np.float64).tolist(),
            global_step=step,
        )

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def open_log(run_dir: Path, suffix: str = "") -> TensorBoardLog | None:
    """The run's TensorBoard log, or None (said once) when the tensorboard package is missing."""
    try:
        return TensorBoardLog(Path(run_dir) / LOG_DIR, suffix)
    except ImportError:
        log.warning("no TensorBoard logs: the tensorboard package is not installed (pip install tensorboard)")
        return None


class LearnerCurves:
    """Turns the learner's status snapshots into TensorBoard points; rates come from successive snapshots."""

    def __init__(self, board: TensorBoardLog) -> None:
        self.board = board
        self._last: dict[str, Any] | None = None

    def write(self, status: Mapping[str, Any]) -> None:
        step = int(status.get("env_steps", 0))
        robots: Mapping[str, Mapping[str, Any]] = status.get("robots") or {}
        now = {
            "time": float(status.get("time", 0.0)),
            "env_steps": step,
            "updates": int(status.get("updates", 0)),
            "robots": {rid: int(r.get("transitions", 0)) for rid, r in robots.items()},
            "lags": np.asarray(status.get("policy_lag_counts") or [], np.int64),
        }
        values: dict[str, float | None] = {
            "rollout/return": status.get("recent_return"),
            "rollout/success": status.get("recent_success"),
            "interventions/rate": status.get("intervention_rate"),
            "buffer/transitions": status.get("buffer"),
            "buffer/stale_transitions": status.get("stale_transitions"),
            "policy/version": status.get("policy_version"),
            "policy/updates": now["updates"],
            "robots/active": len(robots),
            **{f"loss/{name}": value for name, value in (status.get("metrics") or {}).items()},
        }
        lag_updates = status.get("policy_lag_updates") or {}  # over the last rows the policy acted (staleness.py)
        for q in ("p50", "p99"):
            values[f"staleness/lag_updates_{q}"] = lag_updates.get(q)
        last = self._last
        if last is not None and now["time"] > last["time"]:
            dt = now["time"] - last["time"]
            values["throughput/env_steps_per_s"] = (step - last["env_steps"]) / dt
            values["throughput/updates_per_s"] = (now["updates"] - last["updates"]) / dt
            for rid, transitions in now["robots"].items():
                values[f"robots/{rid}/steps_per_s"] = (transitions - last["robots"].get(rid, transitions)) / dt
            fresh = _since(now["lags"], last["lags"])
            self.board.counts("staleness/policy_lag", step, fresh)
        self.board.scalars(step, values)
        self._last = now


def _since(counts: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Counts added since `before` (both only grow; the newer one may have more bins)."""
    added = counts.copy()
    added[: len(before)] -= before[: len(added)]
    return np.maximum(added, 0)
