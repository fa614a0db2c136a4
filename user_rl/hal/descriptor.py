"""What a device is, readable before anyone connects to it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from user_rl.hal.robot import Robot

DeviceKind = Literal["robot", "sim", "camera", "gpu"]


@dataclass(frozen=True)
class DeviceDescriptor:
    """Identity of one device: enough for a scheduler to place work and a learner to greet it."""

    kind: DeviceKind
    model: str
    id: str
    control_hz: float = 0.0
    instruction: str = ""
    cameras: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)
    # Limits a safety layer enforces: (low, high) per joint in rad, and the end effector's box in
    # metres as (low, high) for x, y and z in the robot's base frame. Empty: the driver gives none.
    joint_limits: tuple[tuple[float, float], ...] = ()
    workspace: tuple[tuple[float, float], ...] = ()


def _space_text(space: Any) -> str:
    low, high = getattr(space, "low", None), getattr(space, "high", None)
    bounds = ""
    uniform = low is not None and low.size and (low == low.flat[0]).all() and (high == high.flat[0]).all()
    if uniform and np.isfinite(low.flat[0]) and np.isfinite(high.flat[0]):  # one range for every entry
        bounds = f" in [{low.flat[0]:g}, {high.flat[0]:g}]"
    return f"{space.dtype} {tuple(space.shape)}{bounds}"


def describe(robot: Robot, node: str) -> dict[str, Any]:
    """Everything a person or a scheduler may ask of a connected device, as plain JSON data."""
    health = robot.health()
    return {
        **asdict(robot.descriptor),
        "node": node,
        "observation_space": {key: _space_text(space) for key, space in robot.observation_space.spaces.items()},
        "action_space": _space_text(robot.action_space),
        "health": {"ok": health.ok, "detail": health.detail},
    }
