"""The fleet's operator console: one address for every robot of a run (`user-rl teleop RUN_DIR`).

The console server only serves the page and tells it where the robots' own pages are
(`/api/robots`: each robot's page address and token, read again from the run's teleop.json on
every request, so restarted edges show with their new addresses). The page then opens one
websocket per robot straight to that robot's page server, as the robot page does (no proxy: a
frame goes camera -> edge -> browser, never through here), and shows a tile per robot; focusing a
robot shows that robot's own page beside the grid (static/console.js says how).

The console has a token of its own. It gives every robot's page token, so it is never printed:
the console prints its address without it and writes the full address to an owner-only file
(`RUN_DIR/console.url`; for a page given by its address, `$XDG_STATE_HOME/user-rl/console.url`).
A request without the token, or with a wrong one, gets 401 and the path of that file.

    GET /?token=T                  the console page (`&name=NAME`: who you are on the robots' pages)
    GET /console.js|console_tiles.js|console.css   its scripts and style
    GET /api/robots                [{robot, number, address, token, url}] (JSON)
"""

from __future__ import annotations

import asyncio
import getpass
import hmac
import html
import os
import secrets
import socket
import threading
from collections.abc import Callable
from functools import partial
from importlib import resources
from pathlib import Path

from user_rl.edge.teleop.fleet import read_pages

CONSOLE_FILE = "console.url"
STATIC = resources.files("user_rl.edge.teleop") / "static"
Printer = Callable[[str], None]
print_now: Printer = partial(print, flush=True)


def url_file_for(target: str) -> Path:
    """Where the console's address with its token goes: the run directory, else the user's state directory."""
    if not target.startswith(("http://", "https://")):
        return Path(target) / CONSOLE_FILE
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "user-rl" / CONSOLE_FILE


def write_url_file(path: Path, url: str) -> None:
    """Write `url` to `path`, readable by its owner only (it holds the console's token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(url + "\n")
    os.chmod(tmp, 0o600)  # an existing .tmp keeps its mode through O_CREAT
    os.replace(tmp, path)


def robots(target: str) -> dict:
    """What `/api/robots` answers: every robot's page, numbered as the console's keys pick them (1-9)."""
    try:
        pages = read_pages(target)
    except (OSError, ValueError) as exc:  # a run directory that went away, a page that is down
        return {"robots": [], "error": str(exc)}
    return {
        "robots": [
            {"robot": p.robot_id, "number": i + 1, "address": p.address, "token": p.token, "url": p.url}
            for i, p in enumerate(pages)
        ],
        "error": None,
    }


class Console:
    """The console's web server for one run directory (or one robot page's address)."""

    def __init__(self, target: str, token: str | None = None, url_file: Path | None = None, name: str = "") -> None:
        self.target = target
        self.token = token or secrets.token_urlsafe(24)
        self.url_file = Path(url_file) if url_file else url_file_for(target)
        self.name = name or getpass.getuser()
        self.address = ""

    @property
    def url(self) -> str:
        return f"{self.address}?token={self.token}"

    def app(self):
        from aiohttp import web

        @web.middleware
        async def require_token(request: web.Request, handler):
            given = request.query.get("token") or request.headers.get("Authorization", "").removeprefix("Bearer ")
            if not given or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
                raise web.HTTPUnauthorized(
                    text=f"the fleet console needs its token{' (this one is wrong)' if given else ''}: "
                    f"open the address in {self.url_file} (readable by the user who started `user-rl teleop`)"
                )
            return await handler(request)

        async def page(request: web.Request) -> web.Response:
            text = (
                (STATIC / "console.html")
                .read_text()
                .replace("{{TOKEN}}", self.token)
                .replace("{{NAME}}", html.escape(self.name, quote=True))
            )
            return web.Response(text=text, content_type="text/html", headers={"Cache-Control": "no-store"})

        async def static(request: web.Request) -> web.Response:
            name = request.path.lstrip("/")
            kind = "application/javascript" if name.endswith(".js") else "text/css"
            return web.Response(text=(STATIC / name).read_text(), content_type=kind)

        async def api_robots(request: web.Request) -> web.Response:
            answer = await asyncio.get_running_loop().run_in_executor(None, robots, self.target)
            return web.json_response(answer, headers={"Cache-Control": "no-store"})

        app = web.Application(middlewares=[require_token])
        app.add_routes(
            [
                web.get("/", page),
                web.get("/console.js", static),
                web.get("/console_tiles.js", static),
                web.get("/console.css", static),
                web.get("/api/robots", api_robots),
            ]
        )
        return app


def serve_console(
    target: str,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    url_file: Path | None = None,
    out: Printer = print_now,
    ready: Callable[[Console], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve the console until interrupted or `stop` is set. It prints the address without the token
    and where the file with the token is; `ready` gets the console once it listens."""
    from aiohttp import web

    read_pages(target)  # a wrong target fails now, not on the first request
    console = Console(target, token, url_file)

    async def main() -> None:
        runner = web.AppRunner(console.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        shown = host if host not in ("0.0.0.0", "::", "") else socket.getfqdn()
        console.address = f"http://{shown}:{runner.addresses[0][1]}/"
        write_url_file(console.url_file, console.url)
        out(f"fleet console: {console.address} (its token: open the address in {console.url_file})")
        if ready is not None:
            ready(console)
        try:
            while stop is None or not stop.is_set():
                await asyncio.sleep(0.2)
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
