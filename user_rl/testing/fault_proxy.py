"""A TCP link with faults between an edge and its learner: latency, a bandwidth cap shared by
every connection, and dropped uplinks. Tests and benchmarks see how the wire behaves on a bad
network without root, `tc` or netem.

One asyncio loop in a background thread pumps bytes. Each direction of each connection is a
reader (socket -> queue, every chunk stamped with its release time) and a writer (queue ->
socket, after the delay, through that direction's token bucket). Queues are bounded, so a
sender beyond the cap feels ordinary TCP backpressure.

    with FaultProxy(learner_address, delay_s=0.05, bandwidth_bps=8e6) as link:
        edge_socket.connect(link.address)
        link.drop(2.0)                       # the uplink vanishes for two seconds
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections import deque
from collections.abc import Coroutine
from typing import Any

CHUNK = 256 * 1024  # bytes read per call
QUEUE_LIMIT = 4 * 1024 * 1024  # per connection and direction; beyond it we stop reading
STREAM_LIMIT = 1024 * 1024  # asyncio reader buffer; the default 64 KiB caps throughput
BURST_S = 0.05  # the token bucket holds this much time's worth of bytes
MIN_BURST = 1500  # bytes; very low caps still move one packet at a time
CONNECT_TIMEOUT_S = 5.0

_KEEP: Any = object()  # "leave unchanged" in `set()`; None already means "no cap"


def _parse(upstream: str) -> tuple[str, int]:
    host, _, port = upstream.removeprefix("tcp://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"upstream must look like tcp://HOST:PORT, got {upstream!r}")
    return host.strip("[]"), int(port)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0 so the peer sees a reset, as when a link really dies."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class _Bucket:
    """One direction of the shared uplink. The lock serves waiting connections in turn."""

    def __init__(self, proxy: FaultProxy) -> None:
        self._proxy = proxy
        self._lock = asyncio.Lock()
        self._tokens = 0.0
        self._last = 0.0

    async def take(self, want: int) -> int:
        """Wait until some bytes may go; return how many (at most `want`, at most one burst)."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            while True:
                bps = self._proxy.bandwidth_bps
                if bps is None:
                    return want
                rate = bps / 8.0
                burst = max(rate * BURST_S, MIN_BURST)
                now = loop.time()
                self._tokens = min(burst, self._tokens + (now - self._last) * rate)
                self._last = now
                n = min(want, int(burst))
                if self._tokens >= n:
                    self._tokens -= n
                    return n
                # Short naps so a cap changed by `set()` applies within one burst.
                await asyncio.sleep(min((n - self._tokens) / rate, BURST_S))


class _Pipe:
    """Bytes read from one socket, waiting for their release time; b"" marks end of stream."""

    def __init__(self, upward: bool) -> None:
        self.upward = upward
        self.items: deque[tuple[float, bytes]] = deque()
        self.queued = 0
        self.ready = asyncio.Event()
        self.space = asyncio.Event()

    def push(self, release: float, data: bytes) -> None:
        self.items.append((release, data))
        self.queued += len(data)
        self.ready.set()

    def pop(self) -> None:
        self.queued -= len(self.items.popleft()[1])
        self.space.set()


class _Conn:
    """One client and its own upstream connection."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task] = []
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True
        for writer in (self.client, self.upstream):
            if writer is not None:
                _abort(writer)
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Listens on an ephemeral port and forwards every connection to `upstream` with faults.

    `delay_s` is one-way latency per direction; `bandwidth_bps` is a cap in bits per second per
    direction, shared by all connections (one uplink that several robots share).
    """

    def __init__(
        self,
        upstream: str,
        listen_host: str = "127.0.0.1",
        delay_s: float = 0.0,
        bandwidth_bps: float | None = None,
        record_bytes: int = 0,
    ) -> None:
        """`record_bytes`: keep up to this many bytes of each direction in `recorded` (what an
        eavesdropper on the wire would see)."""
        self.record_bytes = record_bytes
        self.recorded = {"up": bytearray(), "down": bytearray()}
        self.upstream_host, self.upstream_port = _parse(upstream)
        self.listen_host = listen_host
        self.delay_s = 0.0
        self.bandwidth_bps: float | None = None
        self.set(delay_s=delay_s, bandwidth_bps=bandwidth_bps)
        self.port = 0
        self.bytes_up = self.bytes_down = 0  # forwarded to upstream / to clients (counted before sent)
        self.connections_accepted = self.connections_refused = 0  # refused: reset during a drop
        self.drops = 0
        self._refuse_until = 0.0
        self._conns: set[_Conn] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None

    @property
    def address(self) -> str:
        return f"tcp://{self.listen_host}:{self.port}"

    def start(self) -> FaultProxy:
        if self._loop is not None:
            return self
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        try:
            self._call(self._listen())
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Reset every connection, stop listening and join the pump thread. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            if thread.is_alive():
                self._call(self._shutdown())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10.0)
            loop.close()
            self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set(self, delay_s: float = _KEEP, bandwidth_bps: float | None = _KEEP) -> None:
        """Change faults while running; data already queued keeps its release time."""
        if delay_s is not _KEEP:
            if not delay_s >= 0.0:
                raise ValueError(f"delay_s must be >= 0, got {delay_s}")
            self.delay_s = float(delay_s)
        if bandwidth_bps is not _KEEP:
            if bandwidth_bps is not None and not bandwidth_bps > 0.0:
                raise ValueError(f"bandwidth_bps must be > 0 or None, got {bandwidth_bps}")
            self.bandwidth_bps = None if bandwidth_bps is None else float(bandwidth_bps)

    def drop(self, duration_s: float = 0.0) -> None:
        """Reset every connection now, discard queued data, refuse new ones for `duration_s`."""
        if self._loop is None:
            raise RuntimeError("FaultProxy is not started")
        self._call(self._drop(duration_s))

    def restore(self) -> None:
        """End a drop early: new connections are accepted again."""
        self._refuse_until = 0.0

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10.0)

    async def _listen(self) -> None:
        self._up = _Bucket(self)
        self._down = _Bucket(self)
        self._server = await asyncio.start_server(self._serve, self.listen_host, 0, limit=STREAM_LIMIT)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _drop(self, duration_s: float) -> None:
        self.drops += 1
        self._refuse_until = asyncio.get_running_loop().time() + max(0.0, duration_s)
        for conn in list(self._conns):
            conn.abort()
        # Let the aborted transports close their sockets before drop() returns.
        for _ in range(3):
            await asyncio.sleep(0)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _ in range(3):
            await asyncio.sleep(0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() < self._refuse_until:
            self.connections_refused += 1
            _abort(writer)
            return
        self.connections_accepted += 1
        conn = _Conn(writer)
        self._conns.add(conn)
        try:
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(self.upstream_host, self.upstream_port, limit=STREAM_LIMIT),
                    CONNECT_TIMEOUT_S,
                )
            except (OSError, asyncio.TimeoutError):
                conn.abort()
                return
            conn.upstream = up_writer
            if conn.aborted:  # dropped while connecting
                conn.abort()
                return
            up, down = _Pipe(upward=True), _Pipe(upward=False)
            conn.tasks = [
                loop.create_task(self._read(reader, up)),
                loop.create_task(self._write(up, up_writer, self._up)),
                loop.create_task(self._read(up_reader, down)),
                loop.create_task(self._write(down, writer, self._down)),
            ]
            done, pending = await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_EXCEPTION)
            if pending or any(t.cancelled() or t.exception() is not None for t in done):
                conn.abort()  # a reset on one side becomes a reset on the other
            else:
                writer.close()
                up_writer.close()
        except asyncio.CancelledError:
            # Shutdown. Ending quietly keeps asyncio's stream callback from logging the cancel.
            conn.abort()
        finally:
            self._conns.discard(conn)

    async def _read(self, reader: asyncio.StreamReader, pipe: _Pipe) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(CHUNK)
            seen = self.recorded["up" if pipe.upward else "down"]
            if len(seen) < self.record_bytes:
                seen += data[: self.record_bytes - len(seen)]
            pipe.push(loop.time() + self.delay_s, data)
            if not data:
                return
            while pipe.queued >= QUEUE_LIMIT:
                pipe.space.clear()
                await pipe.space.wait()

    async def _write(self, pipe: _Pipe, writer: asyncio.StreamWriter, bucket: _Bucket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not pipe.items:
                pipe.ready.clear()
                await pipe.ready.wait()
            release, data = pipe.items[0]
            if release > loop.time():
                await asyncio.sleep(release - loop.time())
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            view, sent = memoryview(data), 0
            while sent < len(view):
                n = await bucket.take(len(view) - sent)
                # Count before writing: the peer may hold these bytes (and the test read the
                # counter) before this thread runs another line.
                if pipe.upward:
                    self.bytes_up += n
                else:
                    self.bytes_down += n
                writer.write(view[sent : sent + n])
                sent += n
                await writer.drain()
            pipe.pop()
