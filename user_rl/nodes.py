"""`user-rl hal discover` and `user-rl node start`: what this node has, and a Ray node that
advertises it as custom resources so launches can place edges next to their robots.

    user-rl hal discover configs/lab.yaml --json
    user-rl node start configs/lab.yaml --head --name gpu-box
    user-rl node start configs/lab.yaml --address HEAD:6379 --name arm-bench --sim-slots 0
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections.abc import Callable

from user_rl.config import Config
from user_rl.hal.discovery import ConfiguredRobot, Device, discover, format_table, node_resources
from user_rl.hal.registry import driver_kind
from user_rl.hal.resources import NODE_LABEL, ray_start_command

Printer = Callable[[str], None]


def configured_robots(cfg: Config | None) -> list[ConfiguredRobot]:
    """The real robots a config drives (simulators are counted as slots, not probed one by one)."""
    if cfg is None:
        return []
    return [
        ConfiguredRobot(one.robot.type, opts.pop("robot_id"), opts)
        for one in cfg.embodiment_configs().values()
        if driver_kind(one.robot.type) == "robot"
        for opts in (one.robot_options(i) for i in range(one.fleet.num_robots))
    ]


def discover_node(
    cfg: Config | None, sim_slots: int | None = None, probe: bool = True, lerobot: bool = False
) -> list[Device]:
    return discover(configured_robots(cfg), sim_slots=sim_slots, probe=probe, lerobot=lerobot)


def print_discovery(cfg: Config | None, as_json: bool, sim_slots: int | None, probe: bool, out: Printer = print) -> int:
    devices = discover_node(cfg, sim_slots, probe, lerobot=True)  # a person choosing what to configure
    if as_json:
        out(json.dumps({"devices": [d.as_dict() for d in devices], "resources": node_resources(devices)}, indent=2))
    else:
        out(format_table(devices))
        out(f"\nRay resources for this node: {json.dumps(node_resources(devices), sort_keys=True)}")
    return 0 if all(d.status in ("ok", "candidate", "not probed") for d in devices) else 1


def start_node(
    cfg: Config | None,
    head: bool,
    address: str | None,
    name: str | None,
    labels: dict[str, str],
    sim_slots: int | None,
    port: int | None,
    num_cpus: int | None,
    block: bool,
    dry_run: bool,
    out: Printer = print,
) -> int:
    """Discover this node's devices and start a Ray node that advertises them."""
    devices = discover_node(cfg, sim_slots)
    unreachable = [d for d in devices if d.resource and d.status != "ok"]
    for d in unreachable:
        out(f"warning: {d.kind} {d.name} is left out: {d.status}")
    labels = {**labels, NODE_LABEL: name or os.uname().nodename}
    cmd = ray_start_command(
        node_resources(devices), labels, head=head, address=address, port=port, num_cpus=num_cpus, block=block
    )
    out("$ " + " ".join(cmd))
    if dry_run:
        return 0
    if importlib.util.find_spec("ray") is None:  # a robot controller's install has no Ray (the cluster extra)
        raise ModuleNotFoundError("No module named 'ray'", name="ray")
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}  # one token for every node
    return subprocess.call(cmd, env=env)
