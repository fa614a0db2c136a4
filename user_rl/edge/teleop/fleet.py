"""The fleet's teleop pages: where they are recorded, and `user-rl teleop`, the page that lists
every robot with a link to its own page.

A launch records each edge's page in `<run dir>/teleop.json` (`<run dir>/<embodiment>/teleop.json`
with embodiments), like the learner's addresses, with the run's token: the file is readable by
its owner only. A page given by its address (`http://HOST:PORT/?token=T`, what `user-rl edge`
prints) is asked for its robot's id.

    user-rl teleop runs/reach-20250101-120000        # serve the fleet page, print its address
    user-rl teleop runs/reach-... --list              # print each robot's page and exit
"""

from __future__ import annotations

import html
import json
import os
import secrets
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from user_rl.config import ConfigError

PAGES_FILE = "teleop.json"
Printer = Callable[[str], None]


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


def fleet_html(pages: list[RobotPage]) -> str:
    """The fleet page: each robot, a link to its page, and where it is now."""
    rows = []
    for page in pages:
        state = fetch_state(page)
        if "error" in state:
            cells = [f'<td colspan="5" class="error">{html.escape(state["error"])}</td>']
        else:
            stop = state.get("estop")
            cells = [
                f"<td>{html.escape(str(state[k]))}</td>" for k in ("policy_version", "episode", "driver", "viewers")
            ]
            cells.append(f'<td class="{"error" if stop else ""}">{html.escape(stop or "armed")}</td>')
        link = f'<a href="{html.escape(page.url)}">{html.escape(page.robot_id)}</a>'
        rows.append(f"<tr><td>{link}</td>{''.join(cells)}</tr>")
    body = "".join(rows) or '<tr><td colspan="6">no robot serves a page yet</td></tr>'
    return (
        "<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='3'>"
        "<title>user-rl fleet</title><style>body{font-family:system-ui,sans-serif}td,th{padding:2px 10px;"
        "text-align:left}.error{color:#c00}</style></head><body><h1>Fleet</h1><table><tr><th>robot</th>"
        "<th>policy version</th><th>episode</th><th>driving</th><th>watching</th><th>e-stop</th></tr>"
        f"{body}</table></body></html>"
    )


def serve_fleet_page(
    target: str,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    out: Printer = print,
    ready: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve the fleet page until interrupted or `stop` is set (the run directory is read again on
    every request, so restarted edges show their new addresses). `ready` gets the page's URL."""
    import asyncio

    from aiohttp import web

    token = token or secrets.token_urlsafe(24)
    read_pages(target)  # a wrong target fails now, not on the first request

    async def page(request: web.Request) -> web.Response:
        if not secrets.compare_digest(request.query.get("token", ""), token):
            raise web.HTTPUnauthorized(text="the fleet page needs its token: open the address `user-rl teleop` printed")
        pages = await asyncio.get_running_loop().run_in_executor(None, read_pages, target)
        text = await asyncio.get_running_loop().run_in_executor(None, fleet_html, pages)
        return web.Response(text=text, content_type="text/html")

    async def main() -> None:
        app = web.Application()
        app.add_routes([web.get("/", page)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        url = f"http://{host}:{runner.addresses[0][1]}/?token={token}"
        out(f"fleet page: {url}")
        if ready is not None:
            ready(url)
        try:
            while stop is None or not stop.is_set():
                await asyncio.sleep(0.2)
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
