"""The teleop web UI: each edge daemon serves a page for its robot where people watch it, take
over and drive it (keys or a gamepad), label episodes, reset them and stop it.

    source = make_source(robot, cfg.teleop)              # before the daemon: it joins the mux first
    edge = EdgeDaemon(..., interventions=InterventionMux([source, ...]))
    edge.teleop = start_server(edge, source, cfg.teleop, index)   # prints the page's address and token

The web framework (aiohttp, the `teleop` extra) is imported only when a server starts, so a robot
controller installed without it runs `user-rl edge` as before.
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import TYPE_CHECKING

from user_rl.edge.teleop.source import WebTeleop

if TYPE_CHECKING:
    from user_rl.config import TeleopConfig
    from user_rl.edge.daemon import EdgeDaemon
    from user_rl.edge.teleop.server import TeleopServer
    from user_rl.hal.robot import Robot

log = logging.getLogger(__name__)

TOKEN_ENV = "USER_RL_TELEOP_TOKEN"


def given_token(settings: TeleopConfig) -> str | None:
    """The configured token, else $USER_RL_TELEOP_TOKEN, else None (nobody gave one)."""
    from user_rl.config import TELEOP_TOKEN, ConfigError

    token = settings.token.get_secret_value() if settings.token else os.environ.get(TOKEN_ENV)
    if token and not TELEOP_TOKEN.fullmatch(token):
        raise ConfigError(f"config error: ${TOKEN_ENV} must be at least 16 characters of A-Z a-z 0-9 _ -")
    return token or None


def resolve_token(settings: TeleopConfig) -> str:
    """The given token, else a new random one."""
    return given_token(settings) or secrets.token_urlsafe(24)


def make_source(
    robot: Robot, settings: TeleopConfig, max_action_delta: float | None = None, control_hz: float = 0.0
) -> WebTeleop:
    """The page's source for `robot`: its keys move it in the terms the robot declared, by at most
    the safety filter's per-step limit (`safety.max_action_delta`, or an absolute robot's default)."""
    from user_rl.edge.motion import Motion

    space = robot.action_space
    return WebTeleop(
        space.shape,
        space.low,
        space.high,
        settings.command_timeout_s,
        Motion.for_robot(robot, max_action_delta, control_hz),
        settings.hand_back_after_s,
        settings.idle_hand_back_s,
        getattr(robot, "gripper_index", None),
    )


def start_server(edge: EdgeDaemon, source: WebTeleop, settings: TeleopConfig, index: int = 0) -> TeleopServer:
    """Serve the robot's page (robot `index` of a fleet listens on `settings.port + index`) and print its address."""
    try:
        from user_rl.edge.teleop.server import TeleopServer
    except ModuleNotFoundError as exc:
        if exc.name != "aiohttp":
            raise
        raise RuntimeError(
            "teleop.enabled needs the teleop extra (aiohttp is not installed here): "
            "pip install -e '.[teleop]' in the user-rl checkout"
        ) from exc
    port = settings.port + index if settings.port else 0
    given = given_token(settings)
    server = TeleopServer(edge, source, settings, port, given or secrets.token_urlsafe(24)).start()
    # The token is printed only when this edge made it up (a standalone edge: its operator's terminal
    # is the only place it exists). A given one is never printed: a launch's edges write their output
    # into Ray's worker logs, which any local user can read; its pages are in RUN_DIR/teleop.json.
    where = server.address + " (token: teleop.token or $" + TOKEN_ENV + ")" if given else server.url
    print(f"teleop page for {server.robot_id}: {where}", flush=True)
    log.info("teleop page for %s at %s", server.robot_id, server.address)
    return server
