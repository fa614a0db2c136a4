"""Serves the newest policy version to edges that ask for it (long poll over ROUTER).

An edge sends `WeightsRequest(have_version, held)`. If a newer version exists it gets the
announcement and every chunk it does not hold yet (`held`: a frozen base it keeps, the chunks of
a transfer that broke off); otherwise its request waits here until the next `publish`. A late or
reconnecting edge therefore always ends on the latest version, and no byte is sent twice to an
edge that has it.

Chunks go out as views of the published buffer (no copy). A buffer the trainer reuses is handed
back (`PackedWeights.release`) once a newer version replaced it and every frame that views it has
left: each peer's sends of a version are its claim on that buffer, tracked frame by frame (pyzmq
copies frames under 64 KiB and reports them sent at once, so no single tracker speaks for the
rest). A slow edge holds a buffer a while but never makes the server copy or queue versions.

A peer that stops reading (a hung process, a paused VM) loses its claim on a replaced version
once `claim_timeout_s` passes without one of its frames leaving, so hung edges cannot pin every
buffer and stop publishing. What such an edge later receives of that buffer may be newer bytes:
the part's checksum (taken at publish) fails on the edge, which asks again and gets the newest.
A peer gets nothing new while frames of an earlier send to it are still queued (its newest request
waits until they left), so one that asks and never reads costs one version's frames, not one per
request.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import zmq

from user_rl.security.curve import Gatekeeper, secure_server
from user_rl.security.keys import LEARNER
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import WireError, decode, encode, envelope
from user_rl.wire.weights import PackedWeights, Part, pack

log = logging.getLogger(__name__)

CLAIM_TIMEOUT_S = 15.0  # a peer none of whose frames of a replaced version left for this long loses its claim


@dataclass
class _Claim:
    """One peer's sends of one version: frames (their trackers) that may still read its buffer."""

    packed: PackedWeights
    progress_at: float  # when the last of its frames left (or it was sent)
    trackers: deque[zmq.MessageTracker] = field(default_factory=deque)
    holds_buffer: bool = True  # False once the peer stopped reading: its frames may carry newer bytes

    def settle(self, now: float) -> bool:
        """Forget the frames that left (one peer's leave in order); True while some are still queued."""
        before = len(self.trackers)
        while self.trackers and self.trackers[0].done:
            self.trackers.popleft()
        if len(self.trackers) < before:
            self.progress_at = now
        return bool(self.trackers)


class WeightServer:
    def __init__(
        self,
        context: zmq.Context,
        endpoint: str,
        cast_floats_to: torch.dtype | None = None,
        gate: Gatekeeper | None = None,
        claim_timeout_s: float = CLAIM_TIMEOUT_S,
    ) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.gate = gate
        if gate is not None:
            secure_server(self.socket, gate.keys)
        self.socket.bind(endpoint)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.cast_floats_to = cast_floats_to
        self.latest: PackedWeights | None = None
        self._announce = None  # the latest's announcement, built once
        self.claim_timeout_s = claim_timeout_s
        self._claims: dict[bytes, _Claim] = {}  # by peer: its last send, while frames of it are in ZeroMQ's hands
        self._retiring: list[PackedWeights] = []  # replaced versions whose buffers are not handed back yet
        self._base_crc: tuple[str, int] | None = None  # the frozen base's checksum, by its id: taken once
        self.dropped_claims = 0  # claims of peers that stopped reading, dropped to free their buffer
        self._deferred: dict[bytes, pb.WeightsRequest] = {}  # by peer: its newest request, served once its frames left
        self.deferred_requests = 0  # requests that waited for a peer's queued frames to leave
        self.waiting: dict[bytes, pb.WeightsRequest] = {}
        self.rejected: Counter[str] = Counter()
        self.sent_versions = 0
        self.sent_bytes = 0  # chunk bytes handed to ZeroMQ, all edges together

    @property
    def version(self) -> int:
        return self.latest.version if self.latest else -1

    def publish(self, version: int, weights: Mapping[str, torch.Tensor] | PackedWeights) -> None:
        """Make `version` the newest and send it to every edge waiting for news.

        `weights`: a state dict (packed here) or bytes packed already (the trainer's shared buffer)."""
        if isinstance(weights, PackedWeights):
            packed = self.checksummed(weights.numbered(version))
        else:
            packed = pack(version, weights, self.cast_floats_to)
        if self.latest is not None:
            self._retiring.append(self.latest)
        self.latest, self._announce = packed, packed.announce
        self._release_sent()
        waiting, self.waiting = self.waiting, {}
        for identity, request in waiting.items():
            self._maybe_send(identity, request)

    def checksummed(self, packed: PackedWeights) -> PackedWeights:
        """The version with each part's checksum, taken now (before any edge can get its bytes).

        Safe from another thread (it touches no socket): the learner takes a large actor's checksum on
        the thread that reads the trainer's replies, where zlib runs beside the ingest thread."""
        base = packed.base
        if base is not None and base.crc32 is None:
            if self._base_crc is None or self._base_crc[0] != base.id:  # the base never changes: once
                self._base_crc = (base.id, base.checksummed().crc32)
            base = replace(base, crc32=self._base_crc[1])
        return replace(packed, own=packed.own.checksummed(), base=base)

    def _release_sent(self) -> None:
        """Settle the claims, then hand back the buffers of replaced versions no claim holds."""
        now = time.monotonic()
        drained, dropped = [], 0
        for peer, claim in list(self._claims.items()):
            if not claim.settle(now):
                del self._claims[peer]
                if peer in self._deferred:
                    drained.append((peer, self._deferred.pop(peer)))
            elif (
                claim.holds_buffer
                and claim.packed is not self.latest
                and now - claim.progress_at > self.claim_timeout_s
            ):
                claim.holds_buffer = False  # its frames stay queued (ZeroMQ cannot take them back): watched still
                dropped += 1
                log.warning(
                    "weights: an edge took none of version %d for %.0f s; its claim on the buffer is "
                    "dropped (what it gets later fails its checksum and it asks again)",
                    claim.packed.version,
                    now - claim.progress_at,
                )
        claimed = {id(claim.packed) for claim in self._claims.values() if claim.holds_buffer}
        still = []
        for packed in self._retiring:
            if id(packed) in claimed:
                still.append(packed)
            elif packed.release is not None:
                packed.release()
        self._retiring = still
        self.dropped_claims += dropped  # counted once their buffers are back: a reader never sees one ahead
        for peer, request in drained:
            self._maybe_send(peer, request)

    @property
    def held_buffers(self) -> int:
        """Versions whose buffers are not handed back: the newest and those replaced but still claimed."""
        return len(self._retiring) + (self.latest is not None)

    def poll(self, timeout_ms: int = 0) -> int:
        """Serve the requests that arrived (waiting up to `timeout_ms` for the first); call it often
        even when none came: it also hands back buffers whose frames left or whose peers stopped reading."""
        if self._retiring or self._claims:
            self._release_sent()
        handled = 0
        while self.socket.poll(timeout_ms if handled == 0 else 0):
            frames = self.socket.recv_multipart(copy=False)
            handled += 1
            identity = frames[0].bytes
            try:
                msg = decode(frames[1:])
                if msg.kind != "weights_request":
                    raise WireError("unexpected", f"{msg.kind} is not accepted on the weights link")
                peer = frames[0].get("User-Id") if self.gate else None
                if self.gate is not None and peer != LEARNER and not self.gate.is_enrolled(peer):
                    raise WireError("not_enrolled", f"the key of {peer!r} is not enrolled (revoked?)")
            except WireError as exc:
                self.rejected[exc.reason] += 1
                log.warning("weights link rejected a message: %s", exc)
                self.socket.send_multipart([identity, *encode(envelope(reject=pb.Reject(reason=str(exc))))])
                continue
            self._maybe_send(identity, msg.body)
        return handled

    def _maybe_send(self, identity: bytes, request: pb.WeightsRequest) -> None:
        latest = self.latest
        if latest is None or latest.version <= request.have_version:
            self.waiting[identity] = request
            return
        now = time.monotonic()
        earlier = self._claims.get(identity)
        if earlier is not None and earlier.settle(now):
            self._deferred[identity] = request  # what it was sent is still queued: more would only pile up
            self.deferred_requests += 1
            return
        held = {part.id: part for part in request.held}
        self.socket.send_multipart([identity, *encode(envelope(weights_announce=self._announce))])
        claim = _Claim(latest, now)
        for part, is_base in ((latest.own, False), (latest.base, True)):
            if part is not None:
                self._send_part(identity, latest.version, part, is_base, held.get(part.id), claim)
        if claim.trackers:
            self._claims[identity] = claim
        elif earlier is not None:
            del self._claims[identity]
        self.sent_versions += 1

    def _send_part(
        self, identity: bytes, version: int, part: Part, is_base: bool, held: pb.PartHeld | None, claim: _Claim
    ) -> None:
        """Every chunk of `part` the edge does not hold, as views of the part's buffer."""
        if held is not None and held.complete:
            return
        skip = set(held.chunks) if held is not None else set()
        for index in range(part.num_chunks):
            if index in skip:
                continue
            chunk = part.chunk(index)
            head = envelope(weights_chunk=pb.WeightsChunk(version=version, index=index, base=is_base))
            self._send_tracked([identity, *encode(head, {"bytes": np.frombuffer(chunk, np.uint8)})], claim)
            self.sent_bytes += chunk.nbytes

    def _send_tracked(self, frames: Sequence[bytes | memoryview], claim: _Claim) -> None:
        """Send one message without copying its large frames, keeping a tracker for each frame that
        still views the buffer (pyzmq copies small ones and reports them sent at once)."""
        last = len(frames) - 1
        for index, frame in enumerate(frames):
            tracker = self.socket.send(frame, zmq.SNDMORE if index < last else 0, copy=False, track=True)
            if not tracker.done:
                claim.trackers.append(tracker)

    def close(self) -> None:
        self.socket.close(0)
