"""The fleet's teleop pages: where they are recorded and how they are found (`user-rl teleop`: the
fleet console, console.py, shows them all; `--list` prints them).

A launch records each edge's page in `<run dir>/teleop.json` (`<run dir>/<embodiment>/teleop.json`
with embodiments), like the learner's addresses, with the run's token: the file is readable by
its owner only. A page given by its address (`http://HOST:PORT/?token=T`, what `user-rl edge`
prints) is asked for its robot's id.

    user-rl teleop runs/reach-20250101-120000        # serve the fleet console, print its address
    user-rl teleop runs/reach-... --list              # print each robot's page and exit
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from user_rl.config import ConfigError

PAGES_FILE = "teleop.json"


@dataclass(frozen=True)
class RobotPage:
    robot_id: str
    address: str  # http://HOST:PORT/
    token: str

    @property
    def url(self) -> str:
        return f"{self.address}?token={self.token}"


def write_pages(run_dir: Path, token: str, addresses: dict[str, str | None]) -> bool:
    """Record the pages of a run's robots (robot id -> address; None: not serving). False if unchanged."""
    path = Path(run_dir) / PAGES_FILE
    data = {"token": token, "robots": {r: a for r, a in sorted(addresses.items()) if a}}
    text = json.dumps(data, indent=2)
    if path.is_file() and path.read_text() == text:
        return False
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the token
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return True


def recorded_addresses(run_dir: Path) -> dict[str, str]:
    """Robot id -> page address as `run_dir`'s teleop.json records them (empty: none recorded yet)."""
    path = Path(run_dir) / PAGES_FILE
    try:
        return dict(json.loads(path.read_text())["robots"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def read_pages(target: str) -> list[RobotPage]:
    """The robots' pages of a run directory, or of one page's address."""
    if target.startswith(("http://", "https://")):
        return [page_at(target)]
    run_dir = Path(target)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{target} is neither a run directory nor a page address (http://HOST:PORT/?token=...)")
    files = [run_dir / PAGES_FILE, *sorted(run_dir.glob(f"*/{PAGES_FILE}"))]
    pages = []
    for path in files:
        if path.is_file():
            data = json.loads(path.read_text())
            pages += [RobotPage(r, a, data["token"]) for r, a in data["robots"].items()]
    if not pages and not any(p.is_file() for p in files):
        raise FileNotFoundError(
            f"{run_dir} holds no {PAGES_FILE}: was it launched with teleop.enabled=true (and has its fleet started)?"
        )
    return pages


def page_at(url: str) -> RobotPage:
    """A robot's page from its address with the token (the robot's id is asked for)."""
    parts = urllib.parse.urlsplit(url)
    token = urllib.parse.parse_qs(parts.query).get("token", [""])[0]
    if not token:
        raise ConfigError(f"{url}: a page address needs its token (?token=...), as the edge printed it")
    address = f"{parts.scheme}://{parts.netloc}/"
    state = fetch_state(RobotPage("?", address, token))
    if "error" in state:
        raise ConnectionError(f"{address}: {state['error']}")
    return RobotPage(state["robot"], address, token)


def fetch_state(page: RobotPage, timeout_s: float = 2.0) -> dict:
    """The robot's state from its page, or {"error": why}."""
    try:
        with urllib.request.urlopen(f"{page.address}api/state?token={page.token}", timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return {"error": f"{exc.code} {exc.read().decode(errors='replace').strip()}"}
    except (OSError, ValueError) as exc:
        return {"error": f"unreachable ({exc})"}
