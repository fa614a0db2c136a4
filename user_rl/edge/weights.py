"""Receives new policy versions in a background thread; the control loop swaps them in.

`poll_new()` never blocks: it hands over a complete state dict when one has arrived since the
last call. `wait_for(version)` is the explicit blocking path (evaluation, start-up).

A message that fails to decode is dropped and counted (`errors`). Anything else that goes wrong
in the thread is logged with its traceback and kept in `error` (the edge's status shows it);
the receiver then starts over with a fresh socket, so the robot keeps getting new policies.
"""

from __future__ import annotations

import logging
import threading
import time

import torch
import zmq

from user_rl.security.curve import ClientKeys
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import WireError, decode, encode, envelope
from user_rl.wire.weights import WeightsAssembly

log = logging.getLogger(__name__)


class WeightReceiver:
    def __init__(self, context: zmq.Context, address: str, resend_s: float = 5.0,
                 curve: ClientKeys | None = None) -> None:
        self.context = context
        self.curve = curve
        self.address = address
        self.resend_s = resend_s
        self.version = -1  # newest complete version received
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._stop = threading.Event()
        self.errors = 0     # messages dropped (undecodable, rejected)
        self.failures = 0   # times the receiver failed and started over
        self.last_failure: str | None = None
        self._thread = threading.Thread(target=self._run, name="weights", daemon=True)
        self._thread.start()

    def poll_new(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    def wait_for(self, min_version: int = 0, timeout: float = 30.0) -> tuple[int, dict[str, torch.Tensor]]:
        """Block until a version ≥ `min_version` is available and return it."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while self._pending is None or self._pending[0] < min_version:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no policy version >= {min_version} from {self.address} in {timeout:.0f}s")
                self._arrived.wait(left)
            pending, self._pending = self._pending, None
        return pending

    @property
    def error(self) -> str | None:
        """What stopped the receiver last (it started over since), or None if it never failed."""
        if self.last_failure is None:
            return None
        return f"{self.last_failure} (failed {self.failures}x, started over each time)"

    def _run(self) -> None:
        """Serve until closed; whatever goes wrong is logged, kept for the status, and the receiver starts over."""
        while not self._stop.is_set():
            try:
                self._serve()
            except Exception as exc:
                failure = f"{type(exc).__name__}: {exc}"
                self.failures += 1
                if failure != self.last_failure:  # the traceback once per kind of failure, not every second
                    log.exception("weights: the receiver failed; starting over")
                else:
                    log.error("weights: the receiver failed again (%s); starting over", failure)
                self.last_failure = failure
                self._stop.wait(1.0)

    def _serve(self) -> None:
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            self.curve.apply(socket)
        socket.connect(self.address)
        assembly: WeightsAssembly | None = None
        request_due = 0.0  # when to (re)send the long-poll request
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= request_due:
                    assembly = None  # an unfinished version is abandoned and asked for again
                    request = pb.WeightsRequest(have_version=self.version)
                    socket.send_multipart(encode(envelope(weights_request=request)))
                    request_due = now + self.resend_s
                if not socket.poll(100):
                    continue
                try:
                    assembly, completed = self._handle(decode(socket.recv_multipart(copy=False)), assembly)
                except WireError as exc:
                    self.errors += 1
                    assembly, completed = None, False
                    log.warning("weights: dropped a message: %s", exc)
                if completed:
                    request_due = 0.0  # ask for the next version at once
                elif assembly is not None:
                    request_due = time.monotonic() + self.resend_s  # chunks are still coming
        finally:
            socket.close(0)

    def _handle(self, msg, assembly: WeightsAssembly | None) -> tuple[WeightsAssembly | None, bool]:
        """Advance the assembly with one message; return it and whether a version completed."""
        if msg.kind == "weights_announce":
            return (WeightsAssembly(msg.body) if msg.body.version > self.version else None), False
        if msg.kind == "weights_chunk":
            if assembly is None or msg.body.version != assembly.version:
                return assembly, False  # a chunk of a version we are not collecting
            if not assembly.add(msg.body.index, msg.arrays["bytes"]):
                return assembly, False
            state = assembly.state()
            with self._arrived:
                self.version = assembly.version
                self._pending = (assembly.version, state)
                self._arrived.notify_all()
            return None, True
        if msg.kind == "reject":
            raise WireError("rejected", msg.body.reason)
        raise WireError("unexpected", msg.kind)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
