"""`user-rl train`: place the learner and a sim fleet as separate processes on Ray, watch
progress, evaluate, stop, and leave a run directory behind.

Ray only places processes and carries control calls (status, pause, finish); every
transition and every weight travels over the components' own ZeroMQ sockets.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import zmq

from user_rl.config import Config, ConfigError, dump_config
from user_rl.evaluation import EvalResult, evaluate
from user_rl.fleet_health import FleetHealth
from user_rl.placement import actor_options, check_cluster, edge_demands, learner_demand, local_resources, node_names
from user_rl.progress import ProgressPrinter, write_status_json

Printer = Callable[[str], None]


def make_run_dir(cfg: Config) -> Path:
    """A fresh run directory, or the one named by `resume` (which must hold a run)."""
    if cfg.resume:
        run_dir = Path(cfg.resume)
        if not (run_dir / "checkpoint.pt").is_file():
            raise ConfigError(f"config error: resume: {run_dir} holds no checkpoint.pt to resume from")
        return run_dir
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    run_dir = Path(cfg.run_root) / f"{cfg.name}-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return run_dir


class Evaluator:
    """Fetches the learner's newest actor over the weights socket and evaluates it locally."""

    def __init__(self, cfg: Config, weights_address: str) -> None:
        from user_rl.edge.weights import WeightReceiver
        from user_rl.hal.registry import make_robot
        from user_rl.policies import make_actor

        self.cfg = cfg
        self.robot = make_robot(cfg.robot.type, **{**cfg.robot_options(0), "robot_id": "eval"})
        self.actor = make_actor(cfg.policy.type, self.robot.observation_space, self.robot.action_space,
                                hidden=cfg.policy.hidden)
        self.context = zmq.Context()
        self.receiver = WeightReceiver(self.context, weights_address)

    def run(self, version: int, round_index: int) -> EvalResult:
        """Each evaluation round plays new episodes, so stopping never favours one lucky set."""
        _, state = self.receiver.wait_for(version)
        self.actor.load_state_dict(state)
        return evaluate(self.robot, self.actor, self.cfg.stop.eval_episodes,
                        seed=1000 * self.cfg.seed + 100 + round_index)

    def close(self) -> None:
        self.receiver.close()
        self.robot.close()
        self.context.term()


def _start_ray(cfg: Config, address: str | None, out: Printer) -> None:
    """Join the cluster at `address`, or start a local instance that owns the config's devices."""
    import ray

    cores = os.cpu_count() or 1
    if address is None and cfg.fleet.num_robots + 1 > cores:
        out(f"note: {cfg.fleet.num_robots} sims and a learner share {cores} cores; "
            "sims are paced to the learner, so this slows wall time, not learning")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    if address is not None:
        os.environ.setdefault("RAY_AUTH_MODE", "token")  # as `user-rl node start` runs every node
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray.init(
            address=address or "local",  # "local": a fresh instance, never a cluster left running on this machine
            resources=local_resources(cfg) if address is None else None,
            include_dashboard=False if address is None else None,
            logging_level=logging.WARNING,
            log_to_driver=True,
            runtime_env={"env_vars": {"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "OMP_NUM_THREADS": "1"}},
        )


def _place(cfg: Config, run_dir: Path, out: Printer) -> tuple[Any, FleetHealth, dict[str, str]]:
    """Start the learner and one edge per robot, each on a node that has what it holds."""
    import ray

    from user_rl.services import EdgeService, LearnerService

    learner = ray.remote(LearnerService).options(**actor_options(learner_demand(cfg))).remote(
        cfg.model_dump(), str(run_dir.resolve()))
    addresses = ray.get(learner.addresses.remote())
    spool_root = str((run_dir / "spool").resolve())
    demands = edge_demands(cfg)

    def spawn(index: int) -> Any:  # the same robot, spool and address every time it is (re)started
        return ray.remote(EdgeService).options(**actor_options(demands[index])).remote(
            cfg.model_dump(), index, addresses, spool_root)

    fleet = FleetHealth(spawn, [cfg.robot_options(i)["robot_id"] for i in range(len(demands))],
                        cfg.fleet.max_restarts, out, cfg.fleet.stall_s)
    fleet.wait_started()
    return learner, fleet, addresses


def _placement_report(learner: Any, fleet: FleetHealth) -> dict[str, str]:
    """Which node each process runs on, as Ray itself tells each actor (no dashboard needed)."""
    import ray

    def node_of(actor: Any) -> Any:
        return actor.__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id())

    names = node_names(ray.nodes())
    actors = {"learner": learner, **{f"edge:{robot_id}": fleet.edges[robot_id] for robot_id in fleet.active}}
    node_ids = ray.get([node_of(a) for a in actors.values()])
    return {name: names.get(node_id, node_id) for name, node_id in zip(actors, node_ids)}


def train(cfg: Config, out: Printer = print, ray_address: str | None = None) -> dict:
    """Run one training to its stop condition; return the summary (also in summary.json)."""
    import ray

    _start_ray(cfg, ray_address, out)
    started = time.monotonic()
    evaluator = None
    try:
        check_cluster(cfg, ray.nodes())  # before anything is created: a launch that cannot fit fails now
        run_dir = make_run_dir(cfg)
        out(f"run directory: {run_dir}")
        learner, fleet, addresses = _place(cfg, run_dir, out)
        (run_dir / "addresses.json").write_text(json.dumps(addresses))  # `user-rl attach --run-dir` reads it
        placement = _placement_report(learner, fleet)
        out(f"learner at {addresses['data']} (weights {addresses['weights']}); {len(fleet.active)} edge daemons started")
        out("placement: " + ", ".join(f"{name} on {node}" for name, node in sorted(placement.items())))
        evaluator = Evaluator(cfg, addresses["weights"])
        summary = _watch(cfg, learner, fleet, evaluator, run_dir, started, out)
        summary["learner"] = final = ray.get(learner.finish.remote())
        summary["checkpoint"] = final["checkpoint"]
        summary["edges"] = fleet.finish()
        summary["placement"] = placement
    finally:
        if evaluator is not None:
            evaluator.close()
        ray.shutdown()
    summary["wall_s"] = round(time.monotonic() - started, 1)
    summary["run_dir"] = str(run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    ProgressPrinter.print_summary(summary, out)
    return summary


def _watch(cfg, learner, fleet: FleetHealth, evaluator: Evaluator, run_dir: Path, started: float,
           out: Printer) -> dict:
    """Poll progress until a stop condition; keep the fleet healthy; evaluate paused snapshots on schedule."""
    import ray

    stop = cfg.stop
    step_cap = cfg.fleet.num_robots * math.floor(stop.max_env_steps / cfg.fleet.num_robots)
    printer = ProgressPrinter(run_dir / "metrics.jsonl", out)
    evals: list[dict] = []
    goal_reached_s = None
    last_eval = time.monotonic()
    reason = "max_wall_s"
    passed = 0  # consecutive evaluations that met the goal
    while time.monotonic() - started < stop.max_wall_s:
        time.sleep(1.0)
        status = ray.get(learner.status.remote())
        fleet.poll()
        if not fleet.active:
            raise RuntimeError("every robot of the fleet failed: " + "; ".join(f"{r}: {why}" for r, why in fleet.failed.items()))
        if len(fleet.active) != status.get("active_robots"):
            ray.get(learner.set_active_robots.remote(len(fleet.active)))
        _write_fleet_status(run_dir, status, fleet)
        if status.get("error"):
            raise RuntimeError(f"learner crashed:\n{status['error']}")
        printer.progress(time.monotonic() - started, status)
        due = time.monotonic() - last_eval >= stop.eval_every_s and status.get("policy_version", 0) > 0
        if status["env_steps"] >= step_cap:
            reason = "max_env_steps"
            break
        if due and (stop.success_rate is not None or stop.mean_return is not None):
            result = _evaluate_snapshot(learner, evaluator, started, printer, evals)
            last_eval = time.monotonic()
            passed = passed + 1 if result.meets(stop.success_rate, stop.mean_return) else 0
            if passed >= stop.confirm_evals:
                goal_reached_s = evals[-1]["time_s"]
                reason = "goal_reached"
                break
            ray.get(learner.resume.remote())
    if reason != "goal_reached":
        _evaluate_snapshot(learner, evaluator, started, printer, evals)
    # The learner stays paused: the checkpoint it writes is the version evaluated last.
    return {"stop_reason": reason, "goal_reached_s": goal_reached_s, "evaluations": evals,
            "final_eval": evals[-1] if evals else None}


def _write_fleet_status(run_dir: Path, learner_status: dict, fleet: FleetHealth) -> None:
    """`fleet_status.json`: each robot's edge (pid, steps, restarts, failure) and what the learner has of it."""
    write_status_json(run_dir / "fleet_status.json",
                      {"edges": fleet.report(), "learner_robots": learner_status.get("robots", {})})


def _evaluate_snapshot(learner, evaluator: Evaluator, started: float, printer: "ProgressPrinter",
                       evals: list[dict]) -> EvalResult:
    """Pause updates and evaluate exactly the version just published (the caller resumes)."""
    import ray

    version = ray.get(learner.pause.remote())
    result = evaluator.run(version, round_index=len(evals))
    record = {"time_s": round(time.monotonic() - started, 1), "policy_version": version, **result.as_dict()}
    evals.append(record)
    printer.evaluation(record)
    return result
