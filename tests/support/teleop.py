"""The settings the teleop page's tests run their fleets with."""

from __future__ import annotations


def teleop_fleet(robots: int, control_hz: float, *more: str) -> list[str]:
    """Overrides for `robots` unpaced edges at `control_hz` serving the teleop page, with a learner
    that never starts training (its updates would only take the CPU from the control loops), then `more`."""
    return [
        f"fleet.num_robots={robots}",
        f"fleet.control_hz={control_hz}",
        "fleet.pace_to_learner=false",
        "algo.learning_starts=100000",
        "teleop.enabled=true",
        *more,
    ]
