"""The teleop web server: one robot's page, served by that robot's edge daemon.

aiohttp runs in a thread of its own with its own event loop, so the control loop never waits on
a browser. The loop tells the server about each step through a step watcher (on the loop's own
thread: the only place the robot may be rendered); the server tells the loop what people ask
through the intervention source (`WebTeleop`), `OperatorRequests` and the e-stop latch file.

Every request needs the token (query `token=`, or an `Authorization: Bearer` header): without it
401, with a wrong one 403. The token makes a viewer; re-arming an e-stop needs an operator's
credential and a confirmation on top (`authority.py`). A driver whose page loses its connection
leaves the robot holding still for `teleop.hand_back_after_s` (`WebTeleop.lost`); one who commands
no motion for `teleop.idle_hand_back_s` is handed back, and their page gets a `handed_back` message
that says why.

    GET /?token=T              the robot's page
    GET /teleop.js|input.js|teleop.css  the page's scripts and style
    GET /api/state             where the robot is (JSON)
    GET /api/frame/CAMERA      the newest camera frame (JPEG)
    GET /ws                    websocket: state and frames out; take over, commands, labels, e-stop in

A camera frame on the websocket is one binary message: the camera's index in the welcome's
`cameras` (1 byte), when the robot captured it (float64 little-endian, ms since the epoch on the
robot's clock: the page's ping gives the offset, so it shows the frame's age), then the JPEG.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
import math
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np
from aiohttp import WSMsgType, web

from user_rl.edge.operator import StepRecord
from user_rl.edge.teleop.authority import PAGE_SOURCE, NotAllowed, check_rearm, read_operators
from user_rl.edge.teleop.controls import control_map, mapping_for_page
from user_rl.edge.teleop.latency import KeyLatency
from user_rl.edge.teleop.robot_view import episode_limit, image_keys, jpeg, named_state
from user_rl.edge.teleop.source import AppliedCommand, IdleHandBack, NotYourTurn, WebTeleop
from user_rl.edge.teleop.tiles import TileTracker
from user_rl.robots.estop import EStopLatch
from user_rl.wire import user_rl_pb2 as pb

if TYPE_CHECKING:
    from user_rl.config import TeleopConfig
    from user_rl.edge.daemon import EdgeDaemon

log = logging.getLogger(__name__)

STATE_HZ = 10.0  # state messages per second to each page
SEND_TIMEOUT_S = 1.0  # a page that does not take a message this fast misses it
FRAME_ON_REQUEST_S = 2.0  # /api/frame keeps frames coming this long
STATIC = resources.files("user_rl.edge.teleop") / "static"


@dataclass
class Client:
    id: str
    name: str
    ws: web.WebSocketResponse
    sent_frame: int = -1
    errors: list[str] = field(default_factory=list)


class TeleopServer:
    def __init__(self, edge: EdgeDaemon, source: WebTeleop, settings: TeleopConfig, port: int, token: str) -> None:
        self.edge, self.source, self.settings, self.token = edge, source, settings, token
        self.robot_id = edge.robot.descriptor.id
        self.latch = EStopLatch(edge.estop.path)  # the loop's latch file; a reader of our own (thread-safe)
        robot = edge.robot
        self.mapping = mapping_for_page(
            control_map(
                robot.action_space, getattr(robot, "gripper_index", None), getattr(robot, "action_names", None)
            ),
            settings.speed,
        )
        self.camera_keys = image_keys(robot.observation_space)
        self.episode_limit = episode_limit(robot)
        if settings.operators_file:  # a wrong operators file fails the start, not the first re-arm
            read_operators(settings.operators_file)
        self.renders = not self.camera_keys and callable(getattr(robot, "render", None))
        self.cameras = self.camera_keys or (["view"] if self.renders else [])
        self._port = port
        self._clients: dict[str, Client] = {}
        self._ids = itertools.count(1)
        self._latest: StepRecord | None = None
        self._frames: dict[str, np.ndarray] = {}
        self._frame_seq = 0
        self._frame_time_ms = 0.0  # time.time() * 1000 when the frames were captured
        self._jpegs: tuple[int, dict[str, bytes]] = (-1, {})
        self._next_frame = 0.0
        self._frames_wanted_until = 0.0
        self.last_label: dict | None = None
        self._step_times: deque[float] = deque(maxlen=41)  # time.monotonic() of the latest steps
        self.key_latency = KeyLatency()  # key -> robot of every driver, shown to everyone watching
        self.tiles = TileTracker(edge)  # what a console's tile shows beyond this state (tiles.py)
        self.estop_requests: list[float] = []  # time.monotonic() of each e-stop pressed on a page
        self.bad_messages = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.address = ""
        self.thread = threading.Thread(target=self._serve, name=f"teleop-{self.robot_id}", daemon=True)

    # -- life ------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The page's address with its token: what a person opens."""
        return f"{self.address}?token={self.token}"

    def start(self) -> TeleopServer:
        self.thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(
                f"{self.robot_id}: the teleop page could not start on {self.settings.host}:{self._port}: {self._error}"
            )
        self.edge.step_watchers.append(self.on_step)
        return self

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start_site())
        except BaseException as exc:  # e.g. the port is taken
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._frame_ready = asyncio.Event()  # the loop captured a frame (set from its thread)
        self._loop = loop
        broadcaster = loop.create_task(self._broadcast())
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            broadcaster.cancel()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

    async def _start_site(self) -> None:
        app = web.Application(middlewares=[self._require_token])
        app.add_routes(
            [
                web.get("/", self._page),
                web.get("/teleop.js", self._static),
                web.get("/teleop.css", self._static),
                web.get("/input.js", self._static),
                web.get("/api/state", self._api_state),
                web.get("/api/frame/{camera}", self._api_frame),
                web.get("/ws", self._websocket),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self._port)
        await site.start()
        port = self._runner.addresses[0][1]
        host = self.settings.host if self.settings.host not in ("0.0.0.0", "::", "") else socket.getfqdn()
        self.address = f"http://{host}:{port}/"

    def close(self) -> None:
        if self.on_step in self.edge.step_watchers:
            self.edge.step_watchers.remove(self.on_step)
        if self._loop is not None and self.thread.is_alive():
            for client in list(self._clients.values()):
                self.source.lost(client.id)  # its handler may not get to run: a driver's robot holds still
                asyncio.run_coroutine_threadsafe(client.ws.close(), self._loop)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self.thread.join(timeout=5)

    # -- the control loop's side (its own thread) --------------------------------------------------
    def on_step(self, record: StepRecord) -> None:
        """After each step: keep it for the pages, report a command's first step, grab frames while watched."""
        self._latest = record
        self._step_times.append(time.monotonic())
        self.tiles.on_step(record)
        if record.label != pb.LABEL_NONE:
            self.last_label = {"episode": record.episode, "step": record.step, "label": pb.Label.Name(record.label)}
        applied = self.source.applied(record)
        if applied is not None and self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._tell_applied(applied), self._loop)
        handed = self.source.took_back()
        if handed is not None:
            log.warning(
                "%s: %s held nothing for %.1f s: handed back, the policy acts",
                self.robot_id,
                handed.person or handed.client,
                handed.idle_s,
            )
            if self._loop is not None:
                asyncio.run_coroutine_threadsafe(self._tell_handed_back(handed), self._loop)
        if (
            self.renders and self._frame_seq == 0
        ):  # a renderer's first frame is slow (GL set-up): not when someone looks
            self.edge.robot.render(size=self.settings.view_size)
            self._frame_seq = 1
        now = time.monotonic()
        watched = bool(self._clients) or now < self._frames_wanted_until
        if watched and self.cameras and now >= self._next_frame:
            self._next_frame = max(now, self._next_frame + 1.0 / self.settings.frame_hz)
            if self.renders:
                self._frames = {"view": self.edge.robot.render(size=self.settings.view_size)}
            else:
                self._frames = {key: np.array(record.obs[key]) for key in self.camera_keys}
            self._frame_time_ms = time.time() * 1000.0
            self._frame_seq += 1
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._frame_ready.set)  # send it now

    def _loop_hz(self) -> float:
        """Steps a second over the latest 40 steps (0 when the robot has not stepped for a second:
        stopped, held, or waiting for its learner)."""
        times = list(self._step_times)
        if len(times) < 2 or time.monotonic() - times[-1] > 1.0:
            return 0.0
        return round((len(times) - 1) / max(times[-1] - times[0], 1e-6), 1)

    # -- HTTP --------------------------------------------------------------------------------------
    @web.middleware
    async def _require_token(self, request: web.Request, handler: Any) -> web.StreamResponse:
        given = request.query.get("token") or request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not given:
            raise web.HTTPUnauthorized(
                text=f"{self.robot_id}: this teleop page needs its token: open the address "
                "the edge printed at start (it ends in ?token=...)"
            )
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise web.HTTPForbidden(text=f"{self.robot_id}: wrong teleop token")
        return await handler(request)

    async def _page(self, request: web.Request) -> web.Response:
        html = (STATIC / "index.html").read_text().replace("{{TOKEN}}", self.token).replace("{{ROBOT}}", self.robot_id)
        return web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def _static(self, request: web.Request) -> web.Response:
        name = request.path.lstrip("/")
        kind = "application/javascript" if name.endswith(".js") else "text/css"
        return web.Response(text=(STATIC / name).read_text(), content_type=kind)

    async def _api_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state())

    async def _api_frame(self, request: web.Request) -> web.Response:
        camera = request.match_info["camera"]
        if camera not in self.cameras:
            raise web.HTTPNotFound(
                text=f"{self.robot_id} has no camera {camera!r}; it has: {', '.join(self.cameras) or 'none'}"
            )
        self._frames_wanted_until = time.monotonic() + FRAME_ON_REQUEST_S
        deadline = time.monotonic() + FRAME_ON_REQUEST_S
        while camera not in self._frames and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if camera not in self._frames:
            raise web.HTTPServiceUnavailable(text=f"{self.robot_id}: no frame yet (is the robot stepping?)")
        return web.Response(body=self._encoded()[camera], content_type="image/jpeg")

    def _encoded(self) -> dict[str, bytes]:
        seq, frames = self._frame_seq, self._frames
        if self._jpegs[0] != seq:
            self._jpegs = (seq, {key: jpeg(image) for key, image in frames.items()})
        return self._jpegs[1]

    # -- what the pages see ------------------------------------------------------------------------
    def state(self) -> dict:
        record, edge = self._latest, self.edge
        _, person = self.source.driver
        stop = self.latch.stop()
        state = {
            "type": "state",
            "robot": self.robot_id,
            "policy_version": edge.policy_version,
            "episode": record.episode if record else edge.episodes,
            "step": record.step if record else 0,
            "episode_steps": record.step + 1 if record else 0,
            "episode_limit": self.episode_limit,
            "episode_ended": bool(record and record.ended),
            "estop_source": stop["source"] if stop else None,
            "estop_by": stop["by"] if stop else None,
            "rearmed": edge.estop.last_rearm(),
            "holding_s": self.source.holding,
            "idle_s": None if (idle := self.source.idle_s) is None else round(idle, 1),  # driver commanding nothing
            "reward": round(record.reward, 4) if record else 0.0,
            "steps": edge.steps,
            "actor": pb.Actor.Name(record.actor).removeprefix("ACTOR_").lower() if record else "",
            "action": [round(float(a), 3) for a in record.action] if record else [],  # what the robot was sent
            "proposal": [round(float(a), 3) for a in record.proposal] if record else [],  # what the policy wanted
            "remaining_steps": None if not (record and self.episode_limit) else self.episode_limit - record.step - 1,
            "loop_hz": self._loop_hz(),  # how fast the robot's loop really steps
            "key_latency": self.key_latency.summary(),
            "driver": edge.interventions.driver_name or "policy",
            "teleop_driver": person or None,
            "viewers": len(self._clients),
            "estop": self.latch.tripped(),
            "last_label": self.last_label,
            **self.tiles.state(),
        }
        if record is not None:
            state["observation"] = named_state(edge.robot, record.obs, self.camera_keys)
        return state

    async def _send(self, client: Client, message: dict | bytes) -> None:
        try:
            if isinstance(message, bytes):
                await asyncio.wait_for(client.ws.send_bytes(message), SEND_TIMEOUT_S)
            else:
                await asyncio.wait_for(client.ws.send_str(json.dumps(message)), SEND_TIMEOUT_S)
        except (asyncio.TimeoutError, ConnectionError, RuntimeError):
            pass  # a slow or closing page misses this one

    async def _send_state(self, client: Client, state: dict | None = None) -> None:
        """`state` (one made for every page of a tick: its latch files are read once) as this page sees it."""
        driver, _ = self.source.driver
        await self._send(client, {**(state or self.state()), "you": client.name, "you_drive": driver == client.id})

    async def _broadcast(self) -> None:
        """State to every page `STATE_HZ` times a second; a camera frame as soon as the loop captured
        it (waiting for the next state tick would add up to a tick to its age)."""
        loop = asyncio.get_running_loop()
        next_state = loop.time()
        while True:
            try:
                await asyncio.wait_for(self._frame_ready.wait(), max(0.0, next_state - loop.time()))
            except asyncio.TimeoutError:
                pass
            self._frame_ready.clear()
            clients = list(self._clients.values())
            jobs = []
            if loop.time() >= next_state:
                next_state = loop.time() + 1.0 / STATE_HZ
                state = self.state() if clients else None
                jobs += [self._send_state(c, state) for c in clients]
            if self._frames and clients:
                encoded, seq = self._encoded(), self._jpegs[0]
                captured = struct.pack("<d", self._frame_time_ms)
                for client in clients:
                    if client.sent_frame != seq:
                        client.sent_frame = seq
                        jobs += [
                            self._send(client, bytes([i]) + captured + encoded[key])
                            for i, key in enumerate(self.cameras)
                            if key in encoded
                        ]
            await asyncio.gather(*jobs)

    async def _tell_handed_back(self, handed: IdleHandBack) -> None:
        client = self._clients.get(handed.client)
        if client is not None:
            await self._send(
                client,
                {
                    "type": "handed_back",
                    "reason": "idle",
                    "idle_s": round(handed.idle_s, 1),
                    "message": f"handed back: you held nothing for {self.settings.idle_hand_back_s:g} s "
                    "(teleop.idle_hand_back_s), so the policy drives again; take over to drive",
                },
            )
            await self._send_state(client)

    async def _tell_applied(self, applied: AppliedCommand) -> None:
        rearmed = self.edge.estop.last_rearm()
        self.key_latency.applied(
            applied.client, applied.command_id, applied.sent_at, rearmed["time"] if rearmed else None
        )
        client = self._clients.get(applied.client)
        if client is not None:
            await self._send(
                client,
                {
                    "type": "applied",
                    "id": applied.command_id,
                    "received_at": applied.received_at,
                    "sent_at": applied.sent_at,
                    "episode": applied.episode,
                    "step": applied.step,
                },
            )

    # -- the websocket: one per page ---------------------------------------------------------------
    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=10.0)
        await ws.prepare(request)
        number = next(self._ids)
        client = Client(id=f"c{number}", name=f"viewer-{number}", ws=ws)
        self._clients[client.id] = client
        await self._send(
            client,
            {
                "type": "welcome",
                "robot": self.robot_id,
                "client": client.id,
                "name": client.name,
                "cameras": self.cameras,
                "mapping": self.mapping,
                "has_gripper": getattr(self.edge.robot, "gripper_index", None) is not None,
                "control_hz": self.edge.settings.control_hz,
                "command_timeout_s": self.settings.command_timeout_s,
                "hand_back_after_s": self.settings.hand_back_after_s,
                "idle_hand_back_s": self.settings.idle_hand_back_s,
                "label_undo_s": self.settings.label_undo_s,
                "slow_loop_hz": self.settings.slow_loop_hz,
                "operators": bool(self.settings.operators_file),
            },
        )
        try:
            async for message in ws:
                if message.type == WSMsgType.TEXT:
                    await self._on_message(client, message.data)
        finally:
            del self._clients[client.id]
            if self.source.lost(client.id):
                log.warning(
                    "%s: %s's page lost its connection while driving: the robot holds still for %.1f s "
                    "(anyone may take over), then the policy acts",
                    self.robot_id,
                    client.name,
                    self.settings.hand_back_after_s,
                )
        return ws

    async def _on_message(self, client: Client, text: str) -> None:
        try:
            message = json.loads(text)
            kind = message["type"]
            reply = self._handle(client, kind, message)
        except (NotYourTurn, NotAllowed, ValueError, KeyError, TypeError) as exc:
            self.bad_messages += 1
            reply = {"type": "error", "message": str(exc) if not isinstance(exc, KeyError) else f"missing {exc}"}
        if reply is not None:
            await self._send(client, reply)
        if reply is None or reply.get("type") != "pong":
            await self._send_state(client)

    def _handle(self, client: Client, kind: str, message: dict) -> dict | None:
        """Act on one message from a page; the reply, if any."""
        if kind == "ping":  # clock offset between page and robot, for the latency display
            return {"type": "pong", "t": message["t"], "server": time.time() * 1000.0}
        if kind == "command":
            self.source.command(client.id, int(message["id"]), message["action"])
            pressed_at = message.get("pressed_at")  # ms on the robot's clock, for the latency everyone sees
            if isinstance(pressed_at, (int, float)) and math.isfinite(pressed_at):
                self.key_latency.pressed(client.id, int(message["id"]), pressed_at)
            return None
        if kind == "hello":
            client.name = str(message.get("name") or client.name)[:40]
        elif kind == "take_over":
            self.source.take_over(client.id, client.name)
            log.warning("%s: %s takes over", self.robot_id, client.name)
        elif kind == "hand_back":
            self.source.hand_back(client.id)
        elif kind == "estop":  # anyone watching may stop the robot
            self.estop_requests.append(time.monotonic())
            if not self.latch.tripped():  # a second press keeps the first stop's reason (and who may clear it)
                self.latch.trip(f"teleop page: {client.name}", source=PAGE_SOURCE, by=client.name)
            log.warning("%s: EMERGENCY STOP pressed on the page by %s", self.robot_id, client.name)
        elif kind == "rearm":
            return self._rearm(client, message)
        elif kind in ("mark", "reset", "discard"):
            return self._request(client, kind, message)
        else:
            raise ValueError(f"unknown message type {kind!r}")
        return {"type": "ok", "for": kind}

    def _rearm(self, client: Client, message: dict) -> dict:
        """Clear the e-stop: an operator's credential and the stop's reason as confirmation (authority.py)."""
        stop = self.latch.stop()
        if stop is None:
            return {"type": "ok", "for": "rearm", "message": "the robot was not stopped"}
        operator = check_rearm(
            stop, str(message.get("credential") or ""), str(message.get("confirm") or ""), self.settings.operators_file
        )
        by = f"operator {operator} (teleop page, {client.name})"
        self.latch.clear(by=by)
        log.warning(
            "%s: re-armed by %s; the %s stop cleared was: %s", self.robot_id, by, stop["source"], stop["reason"]
        )
        return {"type": "ok", "for": "rearm", "message": f"re-armed by {by}"}

    def _request(self, client: Client, kind: str, message: dict) -> None:
        """A mark, reset or discard for the episode (and step) the page showed: the loop applies it to that
        episode only, and tells the page whether it did (a refusal is an error on the page)."""
        driver, person = self.source.driver
        if driver not in (None, client.id) and self.source.holding is None:
            raise NotYourTurn(f"{person} is driving: only they may label or reset this episode")
        episode, step = int(message["episode"]), int(message["step"])
        if episode != self.edge.episodes:  # the loop checks again when it takes the request
            self.edge.requests.refused += 1
            raise ValueError(
                f"{kind} refused: episode {episode} "
                + ("had already ended" if episode < self.edge.episodes else "has not started")
                + f" (episode {self.edge.episodes} is in progress); nothing done"
            )
        loop = self._loop

        def done(applied: bool, text: str) -> None:  # on the control loop's thread
            reply = {"type": "ok", "for": kind, "message": text} if applied else {"type": "error", "message": text}
            if loop is not None:
                asyncio.run_coroutine_threadsafe(self._send(client, reply), loop)

        if kind == "mark":
            self.edge.requests.mark(bool(message["success"]), episode, step, by=client.name, done=done)
        elif kind == "discard":
            self.edge.requests.discard(episode, step, by=client.name, done=done)
        else:
            self.edge.requests.reset(episode, step, by=client.name, done=done)
        return None
