"""End-of-run plots, as PNG files in the run directory: the learning curve and each robot's share.

They are drawn from `metrics.jsonl`, which `user-rl train` appends to every second (progress
records, and `{"eval": ...}` records for evaluations), so they can be drawn again at any time, also
while a run goes on: `user-rl plot RUN_DIR`. matplotlib (in the `cluster` extra) draws them
off-screen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LEARNING_CURVE = "learning_curve.png"
ROBOTS = "robots.png"


class NothingToPlot(ValueError):
    """The run directory has no metrics yet (or is not a run directory)."""


def read_metrics(path: Path) -> tuple[list[dict], list[dict]]:
    """(progress records, evaluation records) of a `metrics.jsonl`; a torn last line is skipped."""
    progress, evals = [], []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the run is still writing it
            continue
        if "eval" in record:
            evals.append(record["eval"])
        else:
            progress.append(record)
    return progress, evals


def metrics_files(run_dir: Path) -> list[Path]:
    """The run's metrics: its own, or each embodiment's (`RUN/<name>/metrics.jsonl`)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NothingToPlot(f"{run_dir} is not a directory")
    own = run_dir / "metrics.jsonl"
    files = [own] if own.is_file() else sorted(run_dir.glob("*/metrics.jsonl"))
    if not files:
        raise NothingToPlot(f"{run_dir} holds no metrics.jsonl (is it a run directory of `user-rl train`?)")
    return files


def render_run_plots(run_dir: Path) -> list[Path]:
    """Draw the plots of every metrics file of the run, next to it; return the files written."""
    written = []
    for path in metrics_files(run_dir):
        progress, evals = read_metrics(path)
        if not progress:
            raise NothingToPlot(f"{path} has no progress records yet")
        if not any(p.get("env_steps") for p in progress):
            raise NothingToPlot(f"{path}: no env steps to plot against (an offline run: its losses are in TensorBoard)")
        title = path.parent.name
        written.append(_learning_curve(progress, evals, path.parent / LEARNING_CURVE, title))
        written.append(_robot_shares(progress, path.parent / ROBOTS, title))
    return written


def _figure(rows: int):
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(rows, 1, figsize=(8, 3.2 * rows), squeeze=False)


def _learning_curve(progress: list[dict], evals: list[dict], out: Path, title: str) -> Path:
    """Success and return against env steps: each evaluation (fresh episodes, deterministic policy)
    as points, and the rollouts' recent episodes (the acting policy, people's help included) as a line."""
    has_success = any(e.get("success_rate") is not None for e in evals) or any(
        p.get("recent_success") is not None for p in progress
    )
    plt, fig, axes = _figure(2 if has_success else 1)
    panels = [("mean_return", "recent_return", "return")]
    if has_success:
        panels.insert(0, ("success_rate", "recent_success", "success rate"))
    for ax, (eval_key, rollout_key, label) in zip(axes[:, 0], panels):
        _line(ax, progress, rollout_key, "rollouts (recent episodes)")
        points = [(e["env_steps"], e[eval_key]) for e in evals if e.get(eval_key) is not None and "env_steps" in e]
        if points:
            ax.plot(*zip(*points), "o-", color="C1", label=f"evaluation ({evals[-1]['episodes']} episodes)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    axes[-1, 0].set_xlabel("env steps")
    axes[0, 0].set_title(f"learning curve {title}")
    return _save(plt, fig, out)


def _robot_shares(progress: list[dict], out: Path, title: str) -> Path:
    """Transitions each robot contributed over the run, and its share of the total."""
    robots = sorted({rid for p in progress for rid in (p.get("robot_transitions") or {})})
    plt, fig, axes = _figure(2)
    over_time, shares = axes[0, 0], axes[1, 0]
    for rid in robots:
        points = [
            (p["time_s"], p["robot_transitions"][rid]) for p in progress if rid in (p.get("robot_transitions") or {})
        ]
        over_time.plot(*zip(*points), label=rid)
    over_time.set_xlabel("time (s)")
    over_time.set_ylabel("transitions stored")
    over_time.set_title(f"per-robot contribution {title}")
    over_time.grid(alpha=0.3)
    if robots:
        over_time.legend(loc="upper left", fontsize=8, ncol=min(4, len(robots)))
    final = _final_counts(progress, robots)
    total = max(sum(final.values()), 1)
    bars = shares.bar(list(final), list(final.values()), color=[f"C{i % 10}" for i in range(len(final))])
    shares.bar_label(bars, labels=[f"{n / total:.0%}" for n in final.values()], fontsize=8)
    shares.set_ylabel("transitions (share)")
    shares.grid(alpha=0.3, axis="y")
    return _save(plt, fig, out)


def _final_counts(progress: list[dict], robots: list[str]) -> dict[str, int]:
    """Each robot's last known count (a robot the learner forgot keeps the count it had)."""
    final: dict[str, int] = {}
    for record in progress:
        final.update(record.get("robot_transitions") or {})
    return {rid: int(final[rid]) for rid in robots}


def _line(ax: Any, progress: list[dict], key: str, label: str) -> None:
    points = [(p["env_steps"], p[key]) for p in progress if p.get(key) is not None]
    if points:
        ax.plot(*zip(*points), color="C0", alpha=0.7, label=label)


def _save(plt: Any, fig: Any, out: Path) -> Path:
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
