"""Serves the newest policy version to edges that ask for it (long poll over ROUTER).

An edge sends `WeightsRequest(have_version, held)`. If a newer version exists it gets the
announcement and every chunk it does not hold yet (`held`: a frozen base it keeps, the chunks of
a transfer that broke off); otherwise its request waits here until the next `publish`. A late or
reconnecting edge therefore always ends on the latest version, and no byte is sent twice to an
edge that has it.

Chunks go out as views of the published buffer (no copy). A buffer the trainer reuses is handed
back (`PackedWeights.release`) once a newer version replaced it and ZeroMQ has sent every chunk
of it, so a slow edge holds a buffer a while but never makes the server copy or queue versions.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Mapping

import numpy as np
import torch
import zmq

from user_rl.wire.codec import WireError, decode, encode, envelope
from user_rl.wire.weights import PackedWeights, Part, pack
from user_rl.security.curve import Gatekeeper, secure_server
from user_rl.security.keys import LEARNER
from user_rl.wire import user_rl_pb2 as pb

log = logging.getLogger(__name__)


class WeightServer:
    def __init__(self, context: zmq.Context, endpoint: str, cast_floats_to: torch.dtype | None = None,
                 gate: Gatekeeper | None = None) -> None:
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
        self._trackers: list[zmq.MessageTracker] = []  # the latest's sends still in ZeroMQ's hands
        self._retiring: list[tuple[PackedWeights, list[zmq.MessageTracker]]] = []
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
            packed = weights.numbered(version)
        else:
            packed = pack(version, weights, self.cast_floats_to)
        if self.latest is not None:
            self._retiring.append((self.latest, self._trackers))
        self.latest, self._announce, self._trackers = packed, packed.announce, []
        self._release_sent()
        waiting, self.waiting = self.waiting, {}
        for identity, request in waiting.items():
            self._maybe_send(identity, request)

    def _release_sent(self) -> None:
        """Hand back the buffers of replaced versions whose chunks ZeroMQ has all sent."""
        still = []
        for packed, trackers in self._retiring:
            if all(t.done for t in trackers):
                if packed.release is not None:
                    packed.release()
            else:
                still.append((packed, trackers))
        self._retiring = still

    def poll(self, timeout_ms: int = 0) -> int:
        if self._retiring:
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
        held = {part.id: part for part in request.held}
        self.socket.send_multipart([identity, *encode(envelope(weights_announce=self._announce))])
        for part, is_base in ((latest.own, False), (latest.base, True)):
            if part is not None:
                self._send_part(identity, latest.version, part, is_base, held.get(part.id))
        self.sent_versions += 1

    def _send_part(self, identity: bytes, version: int, part: Part, is_base: bool, held: pb.PartHeld | None) -> None:
        """Every chunk of `part` the edge does not hold, as views of the part's buffer."""
        if held is not None and held.complete:
            return
        skip = set(held.chunks) if held is not None else set()
        tracker = None
        for index in range(part.num_chunks):
            if index in skip:
                continue
            chunk = part.chunk(index)
            head = envelope(weights_chunk=pb.WeightsChunk(version=version, index=index, base=is_base))
            frames = encode(head, {"bytes": np.frombuffer(chunk, np.uint8)})
            tracker = self.socket.send_multipart([identity, *frames], copy=False, track=True)
            self.sent_bytes += chunk.nbytes
        if tracker is not None:  # ZeroMQ sends one peer's messages in order: the last one done, all are
            self._trackers.append(tracker)

    def close(self) -> None:
        self.socket.close(0)
