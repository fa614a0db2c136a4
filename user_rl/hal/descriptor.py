"""What a device is, readable before anyone connects to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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
