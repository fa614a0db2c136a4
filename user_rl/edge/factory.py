"""Build an edge daemon for one robot of a configured fleet."""

from __future__ import annotations

import torch

from user_rl.config import Config
from user_rl.edge.daemon import EdgeDaemon, EdgeSettings
from user_rl.hal.registry import make_robot
from user_rl.policies import make_actor


def make_edge(cfg: Config, index: int, data_address: str, weights_address: str) -> EdgeDaemon:
    torch.set_num_threads(1)  # an edge runs a small policy; more threads only fight the learner
    options = cfg.robot_options(index)
    robot = make_robot(cfg.robot.type, **options)
    actor = make_actor(cfg.policy.type, robot.observation_space, robot.action_space, hidden=cfg.policy.hidden)
    settings = EdgeSettings(
        control_hz=cfg.fleet.control_hz,
        pace_to_learner=cfg.fleet.pace_to_learner,
        batch_transitions=cfg.fleet.batch_transitions,
        max_batch_delay_s=cfg.fleet.max_batch_delay_s,
        heartbeat_s=cfg.fleet.heartbeat_s,
        seed=options["seed"],
    )
    return EdgeDaemon(robot, actor, data_address, weights_address, settings)
