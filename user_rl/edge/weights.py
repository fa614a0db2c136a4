"""Receives new policy versions in a background thread; the control loop swaps them in.

`poll_new()` never blocks: it hands over a complete state dict when one has arrived since the
last call. `wait_for(version)` is the explicit blocking path (evaluation, start-up).

What arrived is never fetched again: a transfer that breaks off (the link drops, the learner
restarts) resumes with the chunks still missing, and a frozen base part is kept across versions,
so after the first version only the trainable bytes travel. The tensors handed over are views of
the receiver's buffers (one buffer per version: no copy after the socket's). A version's buffer
is used again for a later one once none of its tensors is alive (the policy has loaded it): its
memory is touched already, so assembling costs no page faults.

Each part is applied only if its bytes match the checksum the server took at publish. A part
that does not (the server handed its buffer back while this edge was hung, and the trainer wrote
a newer version into it) is dropped, counted (`checksum_failures`, in the edge's status) and
asked for again: the server sends the newest version, or the same part again.

A message that fails to decode is dropped and counted (`errors`). Anything else that goes wrong
in the thread is logged with its traceback and kept in `error` (the edge's status shows it);
the receiver then starts over with a fresh socket, so the robot keeps getting new policies.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

import numpy as np
import torch
import zmq

from user_rl.security.curve import ClientKeys
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import WireError, decode, encode, envelope
from user_rl.wire.weights import PartAssembly, WeightsAssembly, base_assembly

log = logging.getLogger(__name__)

KEEP_BUFFERS = 2  # used buffers kept for reuse (the newest's may still be loading)
REFETCH_AFTER_S = 0.5  # a part failed its checksum: ask again this soon, unless messages keep coming (an
# answer to an earlier request, e.g. the one a resumed edge sends at once, is on its way then)


class WeightReceiver:
    def __init__(
        self, context: zmq.Context, address: str, resend_s: float = 5.0, curve: ClientKeys | None = None
    ) -> None:
        self.context = context
        self.curve = curve
        self.address = address
        self.resend_s = resend_s
        self.version = -1  # newest complete version received
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._stop = threading.Event()
        self.errors = 0  # messages dropped (undecodable, rejected)
        self.failures = 0  # times the receiver failed and started over
        self.last_failure: str | None = None
        self.received_bytes = 0  # chunk bytes that arrived, all versions together
        self.duplicate_chunks = 0  # chunks that arrived when already held (a resumed transfer should have none)
        self.resumed = 0  # times a broken-off transfer was asked for again with what it already held
        self.completed = 0  # versions received whole
        self.checksum_failures = 0  # parts that arrived whole but not as published: dropped and fetched again
        self._failed_in_row = 0  # of the version being collected: the first is asked for again soon
        self._own: WeightsAssembly | None = None  # the version being collected
        self._base: PartAssembly | None = None  # the frozen base: complete once held, kept across versions
        self._used: list[np.ndarray] = []  # buffers of versions handed over, to reuse once free
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
        request_due = 0.0  # when to (re)send the long-poll request
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= request_due:
                    socket.send_multipart(encode(envelope(weights_request=self._request())))
                    request_due = now + self.resend_s
                if not socket.poll(100):
                    continue
                failed_before = self._failed_in_row
                try:
                    collecting, completed = self._handle(decode(socket.recv_multipart(copy=False)))
                except WireError as exc:
                    self.errors += 1
                    collecting, completed = self._own is not None, False
                    log.warning("weights: dropped a message: %s", exc)
                if completed:
                    request_due = 0.0  # ask for the next version at once
                elif self._failed_in_row > failed_before:  # the first time soon, then as often as any request
                    request_due = time.monotonic() + (
                        min(REFETCH_AFTER_S, self.resend_s) if self._failed_in_row == 1 else self.resend_s
                    )
                elif collecting:
                    request_due = time.monotonic() + self.resend_s  # chunks are still coming
        finally:
            socket.close(0)

    def _request(self) -> pb.WeightsRequest:
        """Ask for anything newer, naming what is held already (the base, a broken-off transfer's chunks)."""
        request = pb.WeightsRequest(have_version=self.version)
        for part in (self._own, self._base):
            if part is not None and (part.complete or part.held):
                request.held.add(id=part.id, complete=part.complete, chunks=[] if part.complete else part.held)
        if self._own is not None:
            self.resumed += 1
        return request

    def _handle(self, msg) -> tuple[bool, bool]:
        """Advance the assemblies with one message; return whether a version is being collected and
        whether one completed."""
        if msg.kind == "weights_announce":
            self._on_announce(msg.body)
            return self._own is not None, False
        if msg.kind == "weights_chunk":
            chunk = msg.body
            part = self._base if chunk.base else self._own
            if self._own is None or chunk.version != self._own.version or part is None:
                return self._own is not None, False  # a chunk of a version we are not collecting
            self.received_bytes += msg.arrays["bytes"].nbytes
            before, was_complete = part.duplicates, part.complete
            part.add(chunk.index, msg.arrays["bytes"])
            self.duplicate_chunks += part.duplicates - before
            if part.complete and not was_complete and not part.intact():
                self._refetch(part)
                return True, False
            if not (self._own.complete and (self._base is None or self._base.complete)):
                return True, False
            state = {**(self._base.state() if self._base is not None else {}), **self._own.state()}
            with self._arrived:
                self.version = self._own.version
                self.completed += 1
                self._pending = (self.version, state)
                self._arrived.notify_all()
            self._used = [self._own.buffer, *self._used][:KEEP_BUFFERS]
            self._own, self._failed_in_row = None, 0
            return False, True
        if msg.kind == "reject":
            raise WireError("rejected", msg.body.reason)
        raise WireError("unexpected", msg.kind)

    def _refetch(self, part: PartAssembly) -> None:
        """Drop a part whose bytes are not the ones published, to collect it again from scratch."""
        self.checksum_failures += 1
        self._failed_in_row += 1
        announce = self._own.announce
        log.warning(
            "weights: part %s of version %d failed its checksum (%d so far); fetching it again",
            part.id,
            announce.version,
            self.checksum_failures,
        )
        if part is self._own:
            self._own = WeightsAssembly(announce, part.buffer)
        else:
            self._base = base_assembly(announce)

    def _on_announce(self, announce: pb.WeightsAnnounce) -> None:
        """Collect a newer version; keep what is held of it already (same version, same base)."""
        if announce.version <= self.version:
            return
        if self._own is None or self._own.version != announce.version:
            self._own = WeightsAssembly(announce, self._free_buffer())
            self._failed_in_row = 0
        base_id = announce.base.id if announce.HasField("base") else None
        if base_id is None:
            self._base = None
        elif self._base is None or self._base.id != base_id:
            self._base = base_assembly(announce)

    def _free_buffer(self) -> np.ndarray | None:
        """A used buffer none of whose tensors is alive any more (only this list refers to it)."""
        for index in range(len(self._used)):
            if sys.getrefcount(self._used[index]) == 2:  # the list's reference and the argument's
                return self._used.pop(index)
        return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
