"""Serves the newest policy version to edges that ask for it (long poll over ROUTER).

An edge sends `WeightsRequest(have_version)`. If a newer version exists it gets the
announcement and every chunk at once; otherwise its request waits here until the next
`publish`. A late or reconnecting edge therefore always fetches the latest version, and no
bytes are sent to an edge that already has it.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import torch
import zmq

from user_rl.wire.codec import WireError, decode, encode, envelope
from user_rl.wire.weights import PackedWeights, pack
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
        self.waiting: dict[bytes, int] = {}
        self.rejected: Counter[str] = Counter()
        self.sent_versions = 0

    @property
    def version(self) -> int:
        return self.latest.announce.version if self.latest else -1

    def publish(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Make `version` the newest and send it to every edge waiting for news."""
        self.latest = pack(version, state, self.cast_floats_to)
        waiting, self.waiting = self.waiting, {}
        for identity, have in waiting.items():
            self._maybe_send(identity, have)

    def poll(self, timeout_ms: int = 0) -> int:
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
            self._maybe_send(identity, msg.body.have_version)
        return handled

    def _maybe_send(self, identity: bytes, have_version: int) -> None:
        if self.latest is None or self.latest.announce.version <= have_version:
            self.waiting[identity] = have_version
            return
        version = self.latest.announce.version
        self.socket.send_multipart([identity, *encode(envelope(weights_announce=self.latest.announce))])
        for index, chunk in enumerate(self.latest.chunks):
            head = envelope(weights_chunk=pb.WeightsChunk(version=version, index=index))
            frames = encode(head, {"bytes": np.frombuffer(chunk, np.uint8)})
            self.socket.send_multipart([identity, *frames], copy=False)
        self.sent_versions += 1

    def close(self) -> None:
        self.socket.close(0)
