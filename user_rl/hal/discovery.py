"""What this node has: configured robots (probed), simulator slots, GPUs, and candidates a
person may want to configure (USB serial adapters, cameras, and LeRobot's robot types when
LeRobot is installed).

`user-rl hal discover` prints it; `user-rl node start` turns it into the node's Ray resources.
Heavy libraries (torch for GPUs, OpenCV for cameras) are imported only when asked for.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from user_rl.hal.descriptor import describe
from user_rl.hal.registry import driver_kind, make_robot, robot_names
from user_rl.hal.resources import device_resource, sim_resource

SERIAL_PATTERNS = ("/dev/serial/by-id/*", "/dev/ttyUSB*", "/dev/ttyACM*")


@dataclass
class Device:
    """One row of the discovery table. `resource` is None for candidates, which are not scheduled."""

    kind: str  # robot / sim / gpu / camera / serial
    name: str
    model: str
    resource: str | None
    count: int = 1
    status: str = "ok"  # ok / unreachable: <why> / candidate
    detail: str = ""
    node: str = field(default_factory=lambda: os.uname().nodename)
    descriptor: dict[str, Any] | None = None  # a probed robot's full description (spaces, limits, health)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ConfiguredRobot:
    """A robot this node drives, as the config names it (driver, id, driver options)."""

    driver: str
    robot_id: str
    options: dict[str, Any]


def discover(
    robots: Iterable[ConfiguredRobot] = (),
    sim_slots: int | None = None,
    probe: bool = True,
    cameras: bool = True,
    lerobot: bool = False,
) -> list[Device]:
    """Everything this node offers; `sim_slots` defaults to the CPU count (one sim per core).
    `lerobot` lists LeRobot's robot types too (importing them all takes seconds)."""
    devices = [_configured(r, probe) for r in robots]
    devices += _sim_slots(sim_slots if sim_slots is not None else (os.cpu_count() or 1))
    devices += _gpus()
    devices += _serial_ports()
    if cameras:
        devices += _cameras()
    if lerobot:
        devices += _lerobot_robot_types()
    return devices


def node_resources(devices: Iterable[Device]) -> dict[str, float]:
    """The custom Ray resources for these devices (Ray counts GPUs itself; candidates are left out)."""
    resources: dict[str, float] = {}
    for d in devices:
        if d.resource and d.resource != "GPU" and d.status == "ok" and d.count > 0:
            resources[d.resource] = resources.get(d.resource, 0.0) + d.count
    return resources


def _configured(robot: ConfiguredRobot, probe: bool) -> Device:
    kind = driver_kind(robot.driver)
    device = Device(kind, robot.robot_id, robot.driver, device_resource(robot.driver, kind, robot.robot_id))
    if not probe:
        device.status = "not probed"
        return device
    try:  # connecting is the probe: the driver opens the device, answers health, and lets go
        with make_robot(robot.driver, **{**robot.options, "robot_id": robot.robot_id}) as connected:
            device.descriptor = described = describe(connected, device.node)
            device.model = described["model"]
            device.detail = (
                f"{described['control_hz']:g} Hz, action {described['action_space']}, "
                f"obs {sorted(described['observation_space'])}"
            )
        if not described["health"]["ok"]:
            device.status = f"unhealthy: {described['health']['detail']}"
    except Exception as exc:  # a probe reports, it never stops discovery
        device.status = f"unreachable: {type(exc).__name__}: {exc}"[:300]
    return device


def _sim_slots(slots: int) -> list[Device]:
    return [
        Device("sim", f"{name} slots", name, sim_resource(name), slots, detail="one simulator per slot")
        for name in robot_names()
        if _is_sim(name)
    ]


def _is_sim(name: str) -> bool:
    try:
        return driver_kind(name) == "sim"
    except Exception:  # a broken third-party driver must not hide the rest
        return False


def _gpus() -> list[Device]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    devices = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        devices.append(Device("gpu", f"cuda:{i}", props.name, "GPU", detail=f"{props.total_memory / 2**30:.0f} GiB"))
    return devices


def _serial_ports() -> list[Device]:
    paths = sorted({os.path.realpath(p): p for pattern in SERIAL_PATTERNS for p in glob.glob(pattern)}.items())
    return [
        Device("serial", shown, "usb-serial", None, status="candidate", detail=real if real != shown else "")
        for real, shown in paths
    ]


def _cameras() -> list[Device]:
    paths = sorted(glob.glob("/dev/video*"))
    if not paths:
        return []
    import cv2

    devices = []
    for path in paths:
        capture = cv2.VideoCapture(path)
        try:
            ok, frame = capture.read() if capture.isOpened() else (False, None)
        finally:
            capture.release()
        if ok and frame is not None:
            devices.append(
                Device("camera", path, "opencv", None, status="candidate", detail=f"{frame.shape[1]}x{frame.shape[0]}")
            )
    return devices


def _lerobot_robot_types() -> list[Device]:
    """LeRobot's robot types (its own and installed plugins'), each a `robot.type: lerobot` candidate."""
    if importlib.util.find_spec("lerobot") is None:
        return []
    from user_rl.hal.lerobot.devices import known_types

    try:
        types = known_types("robot")
    except RuntimeError:  # a `lerobot` that is not LeRobot's, or a broken install
        return []
    return [
        Device(
            "lerobot",
            name,
            "lerobot",
            None,
            status="candidate",
            detail=f"robot.type: lerobot, robot.options.robot: {{type: {name}, ...}} ({cls.__name__})",
        )
        for name, cls in sorted(types.items())
    ]


def format_table(devices: list[Device]) -> str:
    header = ("kind", "name", "model", "resource", "count", "status", "detail")
    rows = [header] + [(d.kind, d.name, d.model, d.resource or "-", str(d.count), d.status, d.detail) for d in devices]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]
    return "\n".join(line.rstrip() for line in lines)
