"""`user-rl train`: place a learner per embodiment and one edge per robot as separate processes
on Ray, watch progress, evaluate, stop, and leave a run directory behind.

Ray only places processes and carries control calls (status, pause, finish); every
transition and every weight travels over the components' own ZeroMQ sockets.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from user_rl.config import Config, ConfigError, StopConfig, dump_config
from user_rl.evaluation import EvalResult
from user_rl.hal.resources import Demand
from user_rl.launch.evaluations import Evaluator, Snapshot
from user_rl.launch.fleet_health import FleetHealth
from user_rl.launch.placement import (
    actor_options,
    check_cluster,
    edge_demands,
    learner_demand,
    local_resources,
    node_names,
)
from user_rl.plots import NothingToPlot, render_run_plots
from user_rl.progress import ProgressPrinter, write_status_json
from user_rl.tensorboard_log import TensorBoardLog, open_log

Printer = Callable[[str], None]
log = logging.getLogger(__name__)


class FleetFailed(RuntimeError):
    """No robot of an embodiment is left to train with; the message says why each one failed."""


def make_run_dir(cfg: Config) -> Path:
    """A fresh run directory (with a subdirectory per embodiment), or the one named by `resume`."""
    if cfg.resume:
        run_dir = Path(cfg.resume)
        for one_model in cfg.embodiment_configs().values():
            if not (Path(one_model.resume) / "checkpoint.pt").is_file():
                raise ConfigError(f"config error: resume: {one_model.resume} holds no checkpoint.pt to resume from")
        return run_dir
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    run_dir = Path(cfg.run_root) / f"{cfg.name}-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    for name, one_model in cfg.embodiment_configs().items():
        if name:  # `user-rl eval`, `attach --run-dir` and resume read an embodiment's own directory
            (run_dir / name).mkdir()
            (run_dir / name / "config.yaml").write_text(dump_config(one_model))
    return run_dir


def _start_ray(cfg: Config, address: str | None, out: Printer) -> None:
    """Join the cluster at `address`, or start a local instance that owns the config's devices."""
    import ray

    cores = os.cpu_count() or 1
    learners = len(cfg.embodiment_configs())
    if address is None and cfg.fleet.num_robots + learners > cores:
        out(
            f"note: {cfg.fleet.num_robots} sims and {learners} learner{'s' if learners > 1 else ''} "
            f"share {cores} cores; "
            "sims are paced to their learner, so this slows wall time, not learning"
        )
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    if address is not None:
        os.environ.setdefault("RAY_AUTH_MODE", "token")  # as `user-rl node start` runs every node
    worker_env = {"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "OMP_NUM_THREADS": "1"}
    with warnings.catch_warnings(), _environment(worker_env if address is None else {}):
        warnings.simplefilter("ignore")
        ray.init(
            address=address or "local",  # "local": a fresh instance, never a cluster left running on this machine
            resources=local_resources(cfg) if address is None else None,
            include_dashboard=False if address is None else None,
            logging_level=logging.WARNING,
            log_to_driver=True,
            # A local instance's processes inherit the environment it starts with (above); a cluster's
            # nodes get it as a runtime environment, which costs every worker's start a few seconds.
            runtime_env={"env_vars": worker_env} if address is not None else None,
        )


@contextlib.contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    """These environment variables set while the block runs, the old values back afterwards."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass
class FleetRun:
    """One embodiment of a launch: its learner, its edges, its evaluator and where it stands.

    A plain run is one FleetRun named "" in the run directory itself; a heterogeneous run has one
    per embodiment, each in `<run dir>/<name>/` with a policy, a buffer and a checkpoint of its own."""

    name: str
    cfg: Config
    run_dir: Path
    out: Printer
    learner: Any = None
    fleet: FleetHealth | None = None
    addresses: dict[str, str] = field(default_factory=dict)
    evaluator: Evaluator | None = None
    printer: ProgressPrinter | None = None
    board: TensorBoardLog | None = None  # the evaluations, beside the learner's own TensorBoard curves
    evals: list[dict] = field(default_factory=list)
    passed: int = 0  # consecutive evaluations that met the goal
    last_eval: float = 0.0
    next_eval_steps: int | None = None  # stop.eval_every_env_steps: the env steps of the next evaluation
    stop_reason: str | None = None  # set when this embodiment is done; its learner then stays paused
    goal_reached_s: float | None = None

    @property
    def learner_label(self) -> str:
        return f"learner:{self.name}" if self.name else "learner"


def _fleet_runs(cfg: Config, run_dir: Path, out: Printer) -> list[FleetRun]:
    runs = []
    for name, one_model in cfg.embodiment_configs().items():
        prefixed = (lambda line, tag=name: out(f"{tag}: {line}")) if name else out
        runs.append(FleetRun(name, one_model, run_dir / name if name else run_dir, prefixed))
    return runs


def learner_actor_name(run_dir: Path) -> str:
    """The Ray name of a run's learner: tools on the same cluster reach it with `ray.get_actor`."""
    return f"user-rl-learner:{Path(run_dir).resolve()}"


def started_error(ray_message: str) -> str:
    """The error an actor raised while starting, from Ray's message (its traceback's last line)."""
    lines = [line for line in ray_message.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ray_message


def _started_learner(learner: Any, demand: Demand, timeout_s: float) -> dict[str, str]:
    """The addresses of a learner once it has started; FleetFailed, saying why, if it raised while
    starting or has not started within `timeout_s` (Ray cannot place it, or its start hangs)."""
    import ray

    try:
        return ray.get(learner.addresses.remote(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.kill(learner, no_restart=True)
        raise FleetFailed(
            f"the learner did not start within {timeout_s:g} s (learner.start_timeout_s); Ray may still be "
            f"waiting for a node with what it holds: {demand.resources or 'nothing'}"
            f"{f' and labels {demand.labels}' if demand.labels else ''}"
        ) from None
    except ray.exceptions.RayActorError as exc:  # it raised while starting: say what, not Ray's traceback
        if not getattr(exc, "actor_init_failed", False):
            raise
        raise FleetFailed(f"the learner could not start: {started_error(str(exc))}") from None


def _place(run: FleetRun) -> None:
    """Start an embodiment's learner and one edge per robot, each on a node that has what it holds."""
    import ray

    from user_rl.services import EdgeService, LearnerService

    cfg = run.cfg
    demand = learner_demand(cfg, ray.cluster_resources())  # `device: auto` takes a GPU when there is one
    run.learner = (
        ray.remote(LearnerService)
        .options(**actor_options(demand), name=learner_actor_name(run.run_dir))
        .remote(cfg.model_dump(), str(run.run_dir.resolve()))
    )
    run.addresses = addresses = _started_learner(run.learner, demand, cfg.learner.start_timeout_s)
    run.next_eval_steps = cfg.stop.next_eval_steps(ray.get(run.learner.status.remote())["env_steps"])
    ray.get(run.learner.set_hold.remote(run.next_eval_steps))  # before any edge steps
    device = ray.get(run.learner.device.remote())
    (run.run_dir / "addresses.json").write_text(json.dumps(addresses))  # `user-rl attach --run-dir` reads it
    run.printer = ProgressPrinter(run.run_dir / "metrics.jsonl", run.out)
    if cfg.offline:  # no robots: nothing to start or to evaluate on
        run.out(f"learner trains on {device}, offline on the attached buffers, to {cfg.stop.max_updates:,} updates")
        return
    spool_root = str((run.run_dir / "spool").resolve())
    demands = edge_demands(cfg)

    def spawn(index: int) -> Any:  # the same robot, spool and address every time it is (re)started
        return (
            ray.remote(EdgeService)
            .options(**actor_options(demands[index]))
            .remote(cfg.model_dump(), index, addresses, spool_root)
        )

    run.fleet = FleetHealth(
        spawn,
        [cfg.robot_options(i)["robot_id"] for i in range(len(demands))],
        cfg.fleet.max_restarts,
        run.out,
        cfg.fleet.stall_s,
        cfg.fleet.start_timeout_s,
    )
    run.fleet.wait_started()
    _record_teleop_pages(run)
    run.out(
        f"learner at {addresses['data']} (weights {addresses['weights']}) trains on {device}; "
        f"{len(run.fleet.active)} edge daemons started"
    )
    run.evaluator = Evaluator(cfg, addresses["weights"])
    run.board = open_log(run.run_dir, suffix=".eval")
    run.last_eval = time.monotonic()  # the first evaluation comes eval_every_s after the fleet started


def _placement_report(runs: list[FleetRun]) -> dict[str, str]:
    """Which node each process runs on, as Ray itself tells each actor (no dashboard needed)."""
    import ray

    def node_of(actor: Any) -> Any:
        return actor.__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id())

    names = node_names(ray.nodes())
    actors = {}
    for run in runs:
        actors[run.learner_label] = run.learner
        if run.fleet is not None:
            actors.update({f"edge:{robot_id}": run.fleet.edges[robot_id] for robot_id in run.fleet.active})
    node_ids = ray.get([node_of(a) for a in actors.values()])
    return {name: names.get(node_id, node_id) for name, node_id in zip(actors, node_ids)}


def train(cfg: Config, out: Printer = print, ray_address: str | None = None) -> dict:
    """Run one training to its stop condition; return the summary (also in summary.json)."""
    import ray

    from user_rl.security.curve import check_launch_keys

    keys_dir = str(Path(cfg.security.keys_dir).resolve())  # actors run in other directories
    cfg = cfg.model_copy(update={"security": cfg.security.model_copy(update={"keys_dir": keys_dir})})
    for one_model in cfg.embodiment_configs().values():  # a missing key fails now, not inside a Ray actor
        check_launch_keys(
            one_model.security,
            one_model.learner.host,
            [one_model.robot_options(i)["robot_id"] for i in range(one_model.fleet.num_robots)],
        )
    _start_ray(cfg, ray_address, out)
    started = time.monotonic()
    runs: list[FleetRun] = []
    try:
        check_cluster(cfg, ray.nodes())  # before anything is created: a launch that cannot fit fails now
        run_dir = make_run_dir(cfg)
        out(f"run directory: {run_dir}")
        if cfg.teleop.enabled:  # one token for the run's pages (never in config.yaml; in teleop.json, owner-only)
            from pydantic import SecretStr

            from user_rl.edge.teleop import resolve_token

            token = SecretStr(resolve_token(cfg.teleop))
            cfg = cfg.model_copy(update={"teleop": cfg.teleop.model_copy(update={"token": token})})
        runs = _fleet_runs(cfg, run_dir, out)
        for run in runs:
            _place(run)
        placement = _placement_report(runs)
        out("placement: " + ", ".join(f"{name} on {node}" for name, node in sorted(placement.items())))
        _watch(runs, cfg.stop, started)
        finals = {run.name: _finish(run) for run in runs}
    finally:
        for run in runs:
            if run.evaluator is not None:
                run.evaluator.close()
            if run.board is not None:
                run.board.close()
        ray.shutdown()
    summary = finals[""] if "" in finals else _combine(finals)
    summary.update(placement=placement, wall_s=round(time.monotonic() - started, 1), run_dir=str(run_dir))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    ProgressPrinter.print_summary(summary, out)
    _draw_plots(run_dir, out)
    return summary


# a run stops for its worst embodiment's reason
STOP_SEVERITY = ("goal_reached", "max_updates", "max_env_steps", "max_wall_s")


def _draw_plots(run_dir: Path, out: Printer) -> None:
    """The end-of-run plots; a run whose plots cannot be drawn (no matplotlib) still succeeded."""
    try:
        written = render_run_plots(run_dir)
    except (ImportError, NothingToPlot) as exc:
        out(f"no plots: {exc}")
        return
    out("plots: " + ", ".join(str(path) for path in written))


def _combine(finals: dict[str, dict]) -> dict:
    """A heterogeneous run's summary: each embodiment's, and the run's stop reason and goal time."""
    reasons = [f["stop_reason"] for f in finals.values()]
    reached = all(r == "goal_reached" for r in reasons)
    return {
        "stop_reason": max(reasons, key=STOP_SEVERITY.index),
        "goal_reached_s": max(f["goal_reached_s"] for f in finals.values()) if reached else None,
        "embodiments": finals,
    }


def _finish(run: FleetRun) -> dict:
    """Stop an embodiment's learner (its final checkpoint is the version evaluated last) and edges."""
    import ray

    final = ray.get(run.learner.finish.remote())
    return {
        "stop_reason": run.stop_reason,
        "goal_reached_s": run.goal_reached_s,
        "evaluations": run.evals,
        "final_eval": run.evals[-1] if run.evals else None,
        "learner": final,
        "checkpoint": final["checkpoint"],
        "edges": run.fleet.finish() if run.fleet is not None else {},
    }


def _watch(runs: list[FleetRun], stop: StopConfig, started: float) -> None:
    """Tend every embodiment once a second until each has met its goal or a limit."""
    while time.monotonic() - started < stop.max_wall_s and not all(run.stop_reason for run in runs):
        time.sleep(1.0)
        for run in runs:
            if run.stop_reason is None:
                _tend(run, stop, started)
    for run in runs:
        if run.stop_reason is None:
            run.stop_reason = "max_wall_s"
            if not run.cfg.offline:
                _evaluate_snapshot(run, started)


def _tend(run: FleetRun, stop: StopConfig, started: float) -> None:
    """Poll one embodiment's progress; keep its fleet healthy; evaluate paused snapshots on schedule."""
    import ray

    status = ray.get(run.learner.status.remote())
    if status.get("error"):
        raise RuntimeError(f"{run.learner_label} crashed:\n{status['error']}")
    run.printer.progress(time.monotonic() - started, status)
    if stop.max_updates is not None and status["updates"] >= stop.max_updates:
        run.stop_reason = "max_updates"
        if not run.cfg.offline:
            _evaluate_snapshot(run, started)
        return
    if run.cfg.offline:
        return
    _record_finished(run, started)
    fleet = run.fleet
    fleet.poll()
    if not fleet.active:
        raise FleetFailed(
            "every robot of the fleet failed: " + "; ".join(f"{r}: {why}" for r, why in fleet.failed.items())
        )
    if len(fleet.active) != status.get("active_robots"):
        ray.get(run.learner.set_active_robots.remote(len(fleet.active)))
    _write_fleet_status(run.run_dir, status, fleet)
    _record_teleop_pages(run)
    robots = run.cfg.fleet.num_robots
    if status["env_steps"] >= robots * math.floor(stop.max_env_steps / robots):
        if not updates_caught_up(run.cfg, status, stop.max_env_steps):
            return
        run.stop_reason = "max_env_steps"
        _evaluate_snapshot(run, started)
        return
    by_steps = run.next_eval_steps is not None and status["env_steps"] >= run.next_eval_steps
    if by_steps and not updates_caught_up(run.cfg, status, run.next_eval_steps):
        return
    by_time = (
        stop.eval_every_s is not None
        and time.monotonic() - run.last_eval >= stop.eval_every_s
        and status.get("policy_version", 0) > 0
    )
    if not (by_steps or by_time):
        return
    if run.cfg.stop.evaluates_beside_training:  # the learner pauses only for the snapshot
        if run.evaluator.busy:
            return  # the fleet holds at this point until the last evaluation has ended
        snapshot, state = _take_snapshot(run)
        if by_steps:
            run.next_eval_steps = stop.next_eval_steps(snapshot.env_steps)
            ray.get(run.learner.set_hold.remote(run.next_eval_steps))
        ray.get(run.learner.resume.remote())  # before the evaluation starts: it plays beside the training
        run.evaluator.start(snapshot, state, lambda: ray.get(run.learner.updates.remote()))
        run.last_eval = time.monotonic()
        return
    result = _evaluate_snapshot(run, started)  # on schedule, goal or not: the learning curve
    if by_steps:
        run.next_eval_steps = stop.next_eval_steps(run.evals[-1]["env_steps"])
        ray.get(run.learner.set_hold.remote(run.next_eval_steps))  # the fleet goes on once resumed
    if stop.success_rate is not None or stop.mean_return is not None:
        run.passed = run.passed + 1 if result.meets(stop.success_rate, stop.mean_return) else 0
        if run.passed >= stop.confirm_evals:
            run.stop_reason, run.goal_reached_s = "goal_reached", run.evals[-1]["time_s"]
            return  # the learner stays paused: the checkpoint it writes is the version evaluated last
    ray.get(run.learner.resume.remote())


def updates_caught_up(cfg: Config, status: dict, env_steps: int) -> bool:
    """Whether an evaluation at `env_steps` may start: with `stop.eval_every_env_steps` on a paced
    fleet, once the learner has made the updates those steps earn (it holds there: `Learner.hold_at`)."""
    if cfg.stop.eval_every_env_steps is None or not cfg.fleet.pace_to_learner:
        return True
    online_updates = status["updates"] - status.get("offline_updates", 0)
    return online_updates >= math.ceil(cfg.algo.utd_ratio * (env_steps - cfg.algo.learning_starts))


def _write_fleet_status(run_dir: Path, learner_status: dict, fleet: FleetHealth) -> None:
    """`fleet_status.json`: each robot's edge (pid, steps, restarts, failure), what the learner has of
    it, and the learner's counters (`user-rl status RUN_DIR` reads it)."""
    counters = {
        key: learner_status.get(key)
        for key in ("time", "env_steps", "updates", "policy_version", "buffer", "failure", "errors")
    }
    try:  # a full disk: written in place if it fits, else this one is lost, never the launch
        write_status_json(
            run_dir / "fleet_status.json",
            {"edges": fleet.report(), "learner_robots": learner_status.get("robots", {}), "learner": counters},
        )
    except OSError as exc:
        log.error("cannot write %s: %s", run_dir / "fleet_status.json", exc)


def _record_teleop_pages(run: FleetRun) -> None:
    """`teleop.json`: each edge's teleop page, for `user-rl teleop RUN_DIR` (a restarted edge's new one too).

    The launch itself prints each new page's address (never the token): the edges print theirs too,
    but into Ray's worker logs, which Ray forwards here de-duplicated: lines that differ only in
    words with digits (robot ids, ports) are merged into one "[repeated Nx across cluster]" line
    with only the newest address, so robot 0's page was never shown while the run was live."""
    if not run.cfg.teleop.enabled:
        return
    from user_rl.edge.teleop.fleet import recorded_addresses, write_pages

    fleet = run.fleet
    pages = {robot_id: fleet.last[robot_id].get("teleop") for robot_id in fleet.active if robot_id in fleet.last}
    before = recorded_addresses(run.run_dir)
    if write_pages(run.run_dir, run.cfg.teleop.token.get_secret_value(), pages):
        for robot_id, address in sorted(pages.items()):
            if address and before.get(robot_id) != address:
                run.out(f"teleop page for {robot_id}: {address}")
        run.out(
            f"teleop: `user-rl teleop {run.run_dir}` serves the fleet console "
            f"(the pages' token is in {run.run_dir / 'teleop.json'}, owner-only)"
        )


def _take_snapshot(run: FleetRun) -> tuple[Snapshot, dict]:
    """Pause the updates and take the version the learner publishes, with where the run stands
    (the caller resumes the learner)."""
    import ray

    version = ray.get(run.learner.pause.remote())
    status = ray.get(run.learner.status.remote())
    return run.evaluator.snapshot(version, status["env_steps"], status["updates"])


def _evaluate_snapshot(run: FleetRun, started: float) -> EvalResult:
    """Evaluate exactly the version the learner publishes now, paused (the caller resumes it); a
    background evaluation still running ends and is recorded first: the curve stays in order."""
    _record_finished(run, started, wait=True)
    snapshot, state = _take_snapshot(run)
    result = run.evaluator.evaluate(snapshot, state)
    run.last_eval = time.monotonic()
    _record_evaluation(run, snapshot, result, snapshot.updates, started)  # paused: no update meanwhile
    return result


def _record_finished(run: FleetRun, started: float, wait: bool = False) -> None:
    """Record the background evaluations that have ended (with `wait`, the running one too)."""
    if run.evaluator is not None:
        for snapshot, result, updates_after in run.evaluator.finished(wait):
            _record_evaluation(run, snapshot, result, updates_after, started)


def _record_evaluation(
    run: FleetRun, snapshot: Snapshot, result: EvalResult, updates_after: int, started: float
) -> None:
    """One point of the learning curve: in the summary, metrics.jsonl, the progress line, TensorBoard.
    `updates_after`: the learner's updates as the evaluation ended (more than the snapshot's when
    the training went on meanwhile)."""
    record = {
        "time_s": round(time.monotonic() - started, 1),
        "policy_version": snapshot.version,
        "env_steps": snapshot.env_steps,
        "updates": snapshot.updates,
        "updates_after": updates_after,
        **result.as_dict(),
    }
    run.evals.append(record)
    run.printer.evaluation(record)
    if run.board is not None:
        run.board.scalars(
            snapshot.env_steps,
            {
                "eval/success_rate": result.success_rate,
                "eval/mean_return": result.mean_return,
                "eval/mean_length": result.mean_length,
            },
        )
        run.board.flush()
