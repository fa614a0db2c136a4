"""Devices as Ray resources: the names a node advertises and a launch asks for, and a
pre-flight check that says at once what cannot be placed (instead of Ray waiting forever).

    simulator slots   "sim:<driver>"    e.g. {"sim:mujoco_reach": 8}; any node with a slot runs a sim
    real robots       "robot:<id>"      one per physical robot, on the node it is wired to
    GPUs              Ray's own "GPU"

Ray itself is not imported here: nodes are the plain dicts `ray.nodes()` returns, so the
placement rules are testable without a cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

NODE_LABEL = "user-rl/node"  # the name a node is shown by (set by `user-rl node start --name`)
_HIDDEN = ("memory", "object_store_memory")  # Ray's bookkeeping, not devices


class PlacementError(ValueError):
    """What a launch asked for that no node of the cluster can give, with the nodes that exist."""


def sim_resource(driver: str) -> str:
    return f"sim:{driver}"


def robot_resource(robot_id: str) -> str:
    return f"robot:{robot_id}"


def device_resource(driver: str, kind: str, robot_id: str) -> str:
    """The resource an edge daemon for this robot holds while it runs."""
    return sim_resource(driver) if kind == "sim" else robot_resource(robot_id)


@dataclass(frozen=True)
class Demand:
    """One process to place: what it is, the resources it holds, the node labels it needs."""

    what: str
    resources: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeView:
    name: str
    resources: dict[str, float]
    labels: dict[str, str]

    @classmethod
    def from_ray(cls, node: dict[str, Any]) -> NodeView:
        labels = {k: v for k, v in (node.get("Labels") or {}).items() if not k.startswith("ray.io/")}
        name = labels.get(NODE_LABEL) or f"{node.get('NodeManagerAddress', '?')}/{node.get('NodeID', '')[:8]}"
        return cls(name, dict(node.get("Resources") or {}), labels)

    def summary(self) -> str:
        shown = {k: v for k, v in sorted(self.resources.items()) if k not in _HIDDEN and not k.startswith("node:")}
        parts = [f"{k} {v:g}" for k, v in shown.items()] + [f"{k}={v}" for k, v in sorted(self.labels.items())]
        return f"{self.name} ({', '.join(parts) or 'nothing'})"


def check_placement(demands: Iterable[Demand], nodes: Iterable[dict[str, Any] | NodeView]) -> None:
    """Raise PlacementError naming every demand that cannot be placed on these (alive) nodes.

    Places demands first-fit, most constrained first, on a copy of the nodes' resources, so a
    resource asked for more often than the cluster has it is caught too.
    """
    views = [n if isinstance(n, NodeView) else NodeView.from_ray(n) for n in nodes]
    if not views:
        raise PlacementError("cannot place anything: the cluster has no live node")
    free = {n.name: dict(n.resources) for n in views}

    def fits(demand: Demand, node: NodeView) -> bool:
        return all(node.labels.get(k) == v for k, v in demand.labels.items()) and all(
            free[node.name].get(r, 0.0) >= q for r, q in demand.resources.items()
        )

    problems = []
    for demand in sorted(demands, key=lambda d: sum(fits(d, n) for n in views)):
        node = next((n for n in views if fits(demand, n)), None)
        if node is None:
            problems.append(_why(demand, views))
            continue
        for r, q in demand.resources.items():
            free[node.name][r] -= q
    if problems:
        nodes_text = "; ".join(n.summary() for n in sorted(views, key=lambda n: n.name))
        raise PlacementError("cannot place " + "; ".join(problems) + f". Nodes: {nodes_text}")


def _why(demand: Demand, nodes: list[NodeView]) -> str:
    labelled = [n for n in nodes if all(n.labels.get(k) == v for k, v in demand.labels.items())]
    if not labelled:
        wanted = ", ".join(f"{k}={v}" for k, v in demand.labels.items())
        return f"{demand.what}: no node has the labels {wanted}"
    for resource, amount in demand.resources.items():
        total = sum(n.resources.get(resource, 0.0) for n in labelled)
        if total == 0:
            return f"{demand.what}: needs resource {resource!r}, which no node has"
        if total < amount or all(n.resources.get(resource, 0.0) < amount for n in labelled):
            return f"{demand.what}: needs {amount:g} of {resource!r} on one node"
    taken = ", ".join(map(repr, demand.resources))
    return f"{demand.what}: the cluster's {taken} are all taken by the rest of this launch"


def ray_start_command(
    resources: dict[str, float],
    labels: dict[str, str],
    head: bool = False,
    address: str | None = None,
    port: int | None = None,
    num_cpus: int | None = None,
    block: bool = False,
) -> list[str]:
    """The `ray start` command line for a node that advertises these devices."""
    if head == bool(address):
        raise ValueError("start either the head node (--head) or a node that joins one (--address ADDR)")
    cmd = ["ray", "start", "--head"] if head else ["ray", "start", "--address", address]
    if head and port:
        cmd += ["--port", str(port)]
    if num_cpus is not None:
        cmd += ["--num-cpus", str(num_cpus)]
    cmd += ["--resources", json.dumps(resources, sort_keys=True)]
    if labels:
        cmd += ["--labels", ",".join(f"{k}={v}" for k, v in sorted(labels.items()))]
    if head:
        cmd += ["--include-dashboard", "false"]
    cmd += ["--disable-usage-stats"]
    if block:
        cmd += ["--block"]
    return cmd
