"""LeRobot robots and teleoperators from a config written the way LeRobot's own CLI names them.

    robot = connect_device("robot", {"type": "so101_follower", "port": "/dev/ttyACM0", "id": "arm"})

`type` is one of LeRobot's registered choices (`lerobot-record --robot.type=...`); the other keys
are that config class's fields, nested ones (cameras) as dicts with their own `type`. A type is
found among LeRobot's own devices and its third-party plugins (packages named `lerobot_robot_*`
or `lerobot_teleoperator_*`, registered the way LeRobot registers them). LeRobot is imported
lazily: the rest of user-rl works without it.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from typing import Any, Literal

from user_rl.extras import LEROBOT_MISSING

log = logging.getLogger(__name__)

DeviceKind = Literal["robot", "teleoperator"]


def _lerobot(kind: DeviceKind) -> tuple[Any, Any, Any]:
    """(package, config base class, make-from-config) for robots or teleoperators."""
    try:
        if kind == "robot":
            import lerobot.robots as package
            from lerobot.robots.config import RobotConfig as base
            from lerobot.robots.utils import make_robot_from_config as make
        else:
            import lerobot.teleoperators as package
            from lerobot.teleoperators.config import TeleoperatorConfig as base
            from lerobot.teleoperators.utils import make_teleoperator_from_config as make
    except ImportError as exc:
        raise RuntimeError(f"a LeRobot {kind} needs LeRobot: {LEROBOT_MISSING} (import failed: {exc})") from None
    return package, base, make


def known_types(kind: DeviceKind) -> dict[str, type]:
    """Every LeRobot robot (or teleoperator) type this machine can build: LeRobot's own (each
    module imported, so each registers) and installed plugins. A module whose hardware library is
    missing still registers its config: that library is needed only when the device is made."""
    from lerobot.utils.import_utils import register_third_party_plugins

    package, base, _ = _lerobot(kind)
    for module in pkgutil.iter_modules(package.__path__):
        try:
            importlib.import_module(f"{package.__name__}.{module.name}")
        except Exception as exc:  # one broken device module must not hide the others
            log.debug("lerobot %s module %s did not import: %s", kind, module.name, exc)
    register_third_party_plugins()
    return dict(base.get_known_choices())


def device_config(kind: DeviceKind, options: dict[str, Any]) -> Any:
    """LeRobot's config object for `{"type": ..., <field>: ...}`, checked by LeRobot's own parser."""
    import draccus

    _, base, _ = _lerobot(kind)
    if not isinstance(options, dict) or not isinstance(options.get("type"), str):
        raise ValueError(
            f"a LeRobot {kind} is configured as {{type: <LeRobot {kind} type>, <its config fields>}}, got {options!r}"
        )
    choices = dict(base.get_known_choices())
    if options["type"] not in choices:
        choices = known_types(kind)
    if options["type"] not in choices:
        raise ValueError(
            f"unknown LeRobot {kind} type {options['type']!r}; this machine has: "
            f"{', '.join(sorted(choices))} (a plugin must be installed as a package named "
            f"lerobot_{'robot' if kind == 'robot' else 'teleoperator'}_<name>)"
        )
    try:
        return draccus.decode(base, dict(options))
    except Exception as exc:
        raise ValueError(f"LeRobot {kind} {options['type']!r}: bad config {options!r}: {exc}") from None


def connect_device(kind: DeviceKind, options: dict[str, Any], calibrate: bool = False) -> Any:
    """Make and connect a LeRobot robot or teleoperator. Calibration is interactive in LeRobot, so
    it runs only when asked for; an uncalibrated device is refused with the command that fixes it."""
    config = device_config(kind, options)
    device = _lerobot(kind)[2](config)
    device.connect(calibrate=calibrate)
    if not device.is_calibrated:
        device.disconnect()
        flag = "robot" if kind == "robot" else "teleop"
        raise RuntimeError(
            f"LeRobot {kind} {options['type']!r} (id {config.id!r}) is not calibrated: run "
            f"`lerobot-calibrate --{flag}.type={options['type']} --{flag}.id={config.id}` "
            f"on this machine, or set calibrate: true to calibrate when it connects"
        )
    return device


def float_names(features: dict[str, Any], what: str) -> list[str]:
    """The scalar (float) features, in LeRobot's order: they make up one vector."""
    names = [name for name, kind in features.items() if kind is float]
    if not names:
        raise ValueError(f"{what} has no scalar (float) features: {features!r}")
    return names
