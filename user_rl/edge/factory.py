"""Build an edge daemon for one robot of a configured fleet."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from user_rl.algos import make_run_actor
from user_rl.config import Config
from user_rl.edge.daemon import EdgeDaemon, EdgeSettings
from user_rl.edge.intervention import InterventionMux
from user_rl.edge.link import LinkSettings
from user_rl.edge.operator import OperatorRequests
from user_rl.edge.scripted import ScriptedIntervener
from user_rl.hal.registry import make_robot
from user_rl.hal.robot import Robot
from user_rl.rewards import make_reward
from user_rl.robots.safety import SafetySettings
from user_rl.security.curve import ClientKeys, robot_client_keys
from user_rl.wire.images import ImageCompression

if TYPE_CHECKING:  # the teleop page is optional (its web framework is the teleop extra)
    from user_rl.edge.teleop.source import WebTeleop

log = logging.getLogger(__name__)


def make_edge(
    cfg: Config,
    index: int,
    data_address: str,
    weights_address: str,
    spool_root: str | Path | None = None,
    robot_id: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> EdgeDaemon:
    """`spool_root/<robot id>` keeps unacked batches across restarts of this edge (None: a temp dir).

    The robot is the fleet's `index`-th (id `<type>-<index>`) unless `robot_id` names it. Pacing to the
    learner is for simulators: a real robot (driver `device_kind = "robot"`) never waits for the learner.
    `progress(stage)` is told each stage of the build as it begins (a launch tells a slow start from a
    hung one by it)."""
    step = progress or (lambda stage: None)
    torch.set_num_threads(1)  # an edge runs a small policy; more threads only fight the learner
    options = cfg.robot_options(index)
    if robot_id is not None:
        options["robot_id"] = robot_id
    step(f"building the robot ({cfg.robot.type} driver)")
    robot = make_robot(cfg.robot.type, **options)
    step(f"building the policy ({cfg.policy.type})")
    real_robot = robot.device_kind == "robot"
    if real_robot and cfg.fleet.pace_to_learner:  # the default (for sims): not a mistake, so not a warning
        log.info("%s: a real robot never waits for the learner: fleet.pace_to_learner is ignored", options["robot_id"])
    actor = make_run_actor(cfg.policy, cfg.algo, robot.observation_space, robot.action_space)
    settings = EdgeSettings(
        control_hz=cfg.fleet.control_hz,
        pace_to_learner=cfg.fleet.pace_to_learner and not real_robot,
        batch_transitions=cfg.fleet.batch_transitions,
        max_batch_delay_s=cfg.fleet.max_batch_delay_s,
        heartbeat_s=cfg.fleet.heartbeat_s,
        seed=options["seed"],
        link=link_settings(
            cfg,
            Path(spool_root) / options["robot_id"] if spool_root else None,
            robot_client_keys(cfg.security, data_address, options["robot_id"]),
            real_robot=real_robot,
        ),
        adapt=cfg.fleet.adapt,
        safety=SafetySettings(max_action_delta=cfg.safety.max_action_delta, deadline_s=cfg.safety.deadline_s),
        async_chunks=cfg.edge.async_chunks,
        device=edge_device(cfg.edge.device),
        apply_weights=cfg.edge.apply_weights,
    )
    requests, interventions = OperatorRequests(), None
    step("building interventions and the reward")
    try:  # a part that cannot be built (no expert, no classifier file) must not leave a device open
        interventions, teleop = intervention_sources(cfg, robot, requests)
        reward = make_reward(cfg.reward.type, robot.observation_space, **cfg.reward.options())
    except BaseException:
        if interventions is not None:
            interventions.close()
        robot.close()
        raise
    step("opening the links and the spool")
    edge = EdgeDaemon(
        robot,
        actor,
        data_address,
        weights_address,
        settings,
        interventions=interventions,
        reward=reward,
        requests=requests,
    )
    if teleop is not None:
        from user_rl.edge.teleop import start_server

        step("starting the teleop page")
        try:
            edge.teleop = start_server(edge, teleop, cfg.teleop, index)
        except BaseException:
            edge.close()
            raise
    return edge


def edge_device(device: str) -> str:
    """The configured device, if this controller has it: a run's config may ask for a GPU that one
    robot's controller lacks."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "edge.device is cuda but this controller has no CUDA GPU (torch.cuda.is_available() "
            "is False); set edge.device: cpu"
        )
    return device


def intervention_sources(
    cfg: Config, robot: Robot, requests: OperatorRequests
) -> tuple[InterventionMux, WebTeleop | None]:
    """Who may act instead of the policy: a person at the teleop page first (the scripted expert
    never locks them out), then a person at a LeRobot teleoperator, then the scripted intervener.
    `requests` takes the teleoperator's success, failure and re-record events."""
    interventions, teleop = InterventionMux(), None
    i = cfg.intervention
    if cfg.teleop.enabled:
        from user_rl.edge.teleop import make_source

        teleop = make_source(robot, cfg.teleop, cfg.safety.max_action_delta, cfg.fleet.control_hz)
        interventions.add(teleop)
    if i.teleoperator is not None:
        from user_rl.edge.lerobot_teleop import LeRobotTeleop

        interventions.add(
            LeRobotTeleop(i.teleoperator, robot, requests, i.teleoperator_drives, i.teleoperator_calibrate)
        )
    if i.scripted:
        interventions.add(
            ScriptedIntervener(
                robot, i.patience, i.min_progress, i.handback_distance, i.demo_episodes, i.watched_fraction
            )
        )
    return interventions, teleop


def link_settings(
    cfg: Config, spool_dir: Path | None, curve: ClientKeys | None = None, real_robot: bool = False
) -> LinkSettings:
    """The link's settings from the fleet config. `real_robot`: the edge drives real hardware
    (`device_kind == "robot"`): `fleet.spool_fsync: null` then fsyncs every spooled batch."""
    fleet = cfg.fleet
    return LinkSettings(
        spool_dir=str(spool_dir) if spool_dir else None,
        spool_max_bytes=int(fleet.spool_max_mb * 2**20),
        spool_fsync=real_robot if fleet.spool_fsync is None else fleet.spool_fsync,
        max_in_flight=fleet.max_in_flight,
        resend_after_s=fleet.resend_after_s,
        ack_timeout_s=fleet.ack_timeout_s,
        compression={k: ImageCompression(c.format, c.quality) for k, c in fleet.compression.items()},
        curve=curve,
    )
