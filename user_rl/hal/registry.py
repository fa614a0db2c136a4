"""Robot drivers by name.

A driver registers with `@register_robot("name")`, or from another installed package through
the `user_rl.robots` entry-point group, so adding a robot never touches an if/elif chain.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from user_rl.hal.robot import Robot

RobotFactory = Callable[..., Robot]
ENTRY_POINT_GROUP = "user_rl.robots"
log = logging.getLogger(__name__)

_factories: dict[str, RobotFactory] = {}


def register_robot(name: str) -> Callable[[RobotFactory], RobotFactory]:
    def decorator(factory: RobotFactory) -> RobotFactory:
        if name in _factories and _factories[name] is not factory:
            raise ValueError(f"robot driver {name!r} is registered twice")
        _factories[name] = factory
        return factory

    return decorator


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def robot_names() -> list[str]:
    return sorted(set(_factories) | set(_entry_points()))


def robot_factory(name: str) -> RobotFactory:
    """Look a driver up by name, loading its entry point on first use."""
    if name not in _factories:
        eps = _entry_points()
        if name not in eps:
            raise KeyError(f"unknown robot type {name!r}; known: {', '.join(robot_names()) or 'none'}")
        _factories.setdefault(name, eps[name].load())
    return _factories[name]


def robot_option_names(name: str) -> list[str] | None:
    """The keyword options a driver accepts, for config validation before anything starts; None
    when the driver needs a package this machine lacks (a robot controller without the sim extra
    reading a config that also has sim robots): its options are checked where it runs."""
    try:
        factory = robot_factory(name)
    except ModuleNotFoundError:
        return None
    params = inspect.signature(factory).parameters.values()
    return [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def make_robot(name: str, **options: Any) -> Robot:
    """Build a robot; a real-robot driver without a hold() is refused (before it connects, if it is a class)."""
    factory = robot_factory(name)
    if isinstance(factory, type) and issubclass(factory, Robot):
        factory.check_holds(name)
    robot = factory(**options)
    type(robot).check_holds(name)
    declared = any("action_mode" in vars(k) for k in type(robot).__mro__ if k not in (Robot, object))
    if robot.device_kind == "robot" and not declared:
        log.warning(
            "robot driver %r does not declare action_mode: its actions are taken as deltas (zero = "
            "no motion); a driver of position goals must declare ActionMode.ABSOLUTE_POSITION",
            name,
        )
    return robot


def driver_kind(name: str) -> str:
    """ "robot" or "sim": how the scheduler counts a driver's devices (read from the class)."""
    return getattr(robot_factory(name), "device_kind", "robot")


def robot_spaces(name: str, options: dict[str, Any]) -> tuple[Any, Any]:
    """(observation_space, action_space) of a driver with these options, without running it.

    A driver may answer through a `spaces(**options)` classmethod. Otherwise a simulator is
    built, read and closed; a real robot's driver is never opened here (that would take the
    hardware from its edge), so it raises LookupError. Raises KeyError/ImportError when the
    driver is not installed on this machine.
    """
    factory = robot_factory(name)
    spaces = getattr(factory, "spaces", None)
    if callable(spaces):
        return spaces(**options)
    if driver_kind(name) != "sim":
        raise LookupError(
            f"robot driver {name!r} has no spaces() classmethod and is not a simulator: "
            "its spaces are known only from its edge's hello"
        )
    robot = factory(**options)
    try:
        return robot.observation_space, robot.action_space
    finally:
        robot.close()
