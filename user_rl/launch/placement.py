"""Where each process of a launch runs: the learner on a node with what it asks for, one edge
daemon per robot on a node that owns that robot (or has a free simulator slot).

Every process holds its device as a Ray resource, so Ray never puts two edges on one robot.
Before anything starts, the whole launch is checked against the cluster's live nodes: a
resource no node has fails at once with a message naming it and the nodes that exist, rather
than Ray waiting for a node that will never come.
"""

from __future__ import annotations

import os
from typing import Any

from user_rl.config import Config
from user_rl.hal.registry import driver_kind
from user_rl.hal.resources import Demand, NodeView, check_placement, device_resource, sim_resource


def learner_wants_gpu(device: str, cluster_resources: dict[str, float]) -> bool:
    """Whether a learner asks Ray for a GPU: always for `cuda`, for `auto` when the cluster has one.

    Ray hides GPUs from an actor that asked for none, so `auto` must ask to be able to use one.
    """
    return device == "cuda" or (device == "auto" and cluster_resources.get("GPU", 0.0) >= 1.0)


def cluster_totals(nodes: list[dict[str, Any]]) -> dict[str, float]:
    """What the live nodes hold in all (as `ray.cluster_resources()`), from `ray.nodes()`."""
    totals: dict[str, float] = {}
    for node in nodes:
        if node.get("Alive", True):
            for name, amount in (node.get("Resources") or {}).items():
                totals[name] = totals.get(name, 0.0) + float(amount)
    return totals


def learner_demand(cfg: Config, cluster_resources: dict[str, float] | None = None) -> Demand:
    """What one learner holds; `cfg` is a one-model config (an embodiment's, or a plain run's).

    `cluster_resources` (`ray.cluster_resources()`) decides whether `device: auto` takes a GPU."""
    resources = dict(cfg.learner.resources)
    if learner_wants_gpu(cfg.learner.device, cluster_resources or {}):
        resources["GPU"] = max(resources.get("GPU", 0.0), 1.0)
    name = f"learner {cfg.fleet.robot_id_prefix}" if cfg.fleet.robot_id_prefix else "learner"
    return Demand(name, resources, dict(cfg.learner.labels))


def edge_demands(cfg: Config) -> list[Demand]:
    kind = driver_kind(cfg.robot.type)
    demands = []
    for i in range(cfg.fleet.num_robots):
        robot_id = cfg.robot_options(i)["robot_id"]
        resource = device_resource(cfg.robot.type, kind, robot_id)
        demands.append(Demand(f"edge {robot_id}", {resource: 1.0}, dict(cfg.fleet.labels)))
    return demands


def launch_demands(cfg: Config, cluster_resources: dict[str, float] | None = None) -> list[Demand]:
    """Every process of a launch: a learner and its edges per embodiment (one for a plain run)."""
    demands = []
    for one_model in cfg.embodiment_configs().values():
        demands += [learner_demand(one_model, cluster_resources), *edge_demands(one_model)]
    return demands


def local_resources(cfg: Config) -> dict[str, float]:
    """A one-machine instance owns the config's robots and a simulator slot per core (at least one per sim)."""
    resources: dict[str, float] = {}
    for one_model in cfg.embodiment_configs().values():
        for demand in edge_demands(one_model):
            for name in demand.resources:
                resources[name] = resources.get(name, 0.0) + 1.0
        if driver_kind(one_model.robot.type) == "sim":
            slots = sim_resource(one_model.robot.type)
            resources[slots] = max(resources.get(slots, 0.0), float(os.cpu_count() or 1))  # none: offline
    return resources


def check_cluster(cfg: Config, nodes: list[dict[str, Any]]) -> None:
    """Raise PlacementError if every learner and every edge cannot all be placed on these nodes."""
    alive = [n for n in nodes if n.get("Alive", True)]
    check_placement(launch_demands(cfg, cluster_totals(alive)), alive)


def actor_options(demand: Demand) -> dict[str, Any]:
    """`ray.remote(...).options(...)` for a demand: its resources (GPUs as num_gpus) and node labels."""
    resources = {k: v for k, v in demand.resources.items() if k != "GPU"}
    options: dict[str, Any] = {"num_cpus": 0, "resources": resources}
    if "GPU" in demand.resources:
        options["num_gpus"] = demand.resources["GPU"]
    if demand.labels:
        options["label_selector"] = dict(demand.labels)
    return options


def node_names(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Ray node id -> the name it is shown by (its user-rl/node label, else address/id)."""
    return {n["NodeID"]: NodeView.from_ray(n).name for n in nodes}
