"""Who may do what from a robot's teleop page.

Two roles. A **viewer** is anyone with the page's token: they watch, take over, drive, label and
press the emergency stop. An **operator** is a person listed in `teleop.operators_file`: only an
operator may re-arm from the page, and only with a confirmation. The confirmation is the stop's
reason, as the page shows it: for a stop pressed on a page the page fills it in once the operator
ticks that the robot is safe to move; a stop set from the CLI or by the robot's own watchdog
(anything not from a page) must have its reason typed. The CLI (`user-rl rearm`, a user on the
robot's controller) may clear any stop. Without an operators file nobody re-arms from the page.

The operators file has one `NAME TOKEN` line per operator (`#` comments; tokens 16+ characters
of A-Z a-z 0-9 _ -) and must be readable by its owner only; it is read again on every attempt,
so adding or removing an operator needs no restart.
"""

from __future__ import annotations

import hmac
import stat
from pathlib import Path

from user_rl.config_sections import TELEOP_TOKEN

PAGE_SOURCE = "page"


class NotAllowed(RuntimeError):
    """The person's role does not allow this, or the confirmation is missing (the message says which)."""


def read_operators(path: str | Path) -> dict[str, str]:
    """NAME -> TOKEN of an operators file; ValueError naming the file and line for anything wrong."""
    path = Path(path).expanduser()
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ValueError(f"teleop.operators_file {path} does not exist") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"teleop.operators_file {path} holds credentials but others may read it: chmod 600 {path}")
    operators: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not TELEOP_TOKEN.fullmatch(parts[1]):
            raise ValueError(f"{path}:{number}: expected `NAME TOKEN` (a token of 16+ characters of A-Z a-z 0-9 _ -)")
        if parts[0] in operators:
            raise ValueError(f"{path}:{number}: operator {parts[0]!r} is listed twice")
        operators[parts[0]] = parts[1]
    return operators


def operator_named_by(credential: str, operators_file: str | None) -> str:
    """The operator whose credential this is; NotAllowed otherwise."""
    if not operators_file:
        raise NotAllowed(
            "re-arming from the page needs an operator, and this robot has none "
            "(teleop.operators_file is not set): re-arm with `user-rl rearm` on the robot's controller"
        )
    try:
        operators = read_operators(operators_file)
    except (ValueError, OSError) as exc:
        raise NotAllowed(f"cannot check operators: {exc}") from None
    given = (credential or "").encode()
    found = [name for name, token in operators.items() if hmac.compare_digest(given, token.encode())]
    if not credential or not found:
        raise NotAllowed("re-arming needs an operator credential: viewers may stop the robot but not re-arm it")
    return found[0]


def check_rearm(stop: dict, credential: str, confirm: str, operators_file: str | None) -> str:
    """The operator allowed to clear `stop` (the latch's record) with this credential and confirmation;
    NotAllowed, saying what is missing, otherwise."""
    name = operator_named_by(credential, operators_file)
    if (confirm or "").strip() != stop["reason"].strip():
        how = (
            "tick that the robot is safe to move"
            if stop["source"] == PAGE_SOURCE
            else f"this stop was set by the {stop['source']}: type its reason exactly to clear it"
        )
        raise NotAllowed(f"confirm the stop you clear ({stop['reason']!r}): {how}")
    return name
