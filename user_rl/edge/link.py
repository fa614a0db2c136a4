"""The edge's data link to the learner: DEALER socket, hello, batches, heartbeats, acks.

Batches stay in `unacked` until the learner acknowledges them (the persistent spool takes
this place later); after a reconnect they are sent again and the learner drops duplicates.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict

import gymnasium as gym
import numpy as np
import zmq

from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import WireError, decode, encode, envelope
from user_rl.wire.spaces import box_to_proto, descriptor_to_proto, dict_space_to_proto

log = logging.getLogger(__name__)


class DataLink:
    def __init__(
        self,
        context: zmq.Context,
        address: str,
        descriptor: DeviceDescriptor,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        epoch: int | None = None,
    ) -> None:
        self.robot_id = descriptor.id
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)
        self.epoch = epoch if epoch is not None else time.time_ns()
        self._hello = pb.Hello(
            descriptor=descriptor_to_proto(descriptor),
            observation_space=dict_space_to_proto(obs_space),
            action_space=box_to_proto(action_space),
            stream_epoch=self.epoch,
        )
        self.seq = 0
        self.unacked: OrderedDict[int, list] = OrderedDict()
        self.step_credit = 0
        self.learner_version = -1
        self.welcomed = False
        self.stop_requested = False
        self.rejects: Counter[str] = Counter()

    def hello(self, policy_version: int = -1) -> None:
        self._hello.policy_version = policy_version
        self._send(envelope(self.robot_id, hello=self._hello))

    def send_batch(self, count: int, columns: dict[str, np.ndarray]) -> int:
        self.seq += 1
        body = pb.TransitionBatch(stream_epoch=self.epoch, seq=self.seq, count=count, send_time=time.time())
        frames = encode(envelope(self.robot_id, batch=body), columns)
        self.unacked[self.seq] = frames
        self.socket.send_multipart(frames, copy=False)
        return self.seq

    def heartbeat(self, **stats: float) -> None:
        self._send(envelope(self.robot_id, heartbeat=pb.Heartbeat(time=time.time(), unacked_batches=len(self.unacked), **stats)))

    def _send(self, env: pb.Envelope) -> None:
        self.socket.send_multipart(encode(env))

    def poll(self, timeout_ms: int = 0) -> int:
        """Handle replies from the learner (acks, credit, rejects, commands)."""
        handled = 0
        while self.socket.poll(timeout_ms if handled == 0 else 0):
            handled += 1
            try:
                msg = decode(self.socket.recv_multipart(copy=False))
            except WireError as exc:
                self.rejects[exc.reason] += 1
                log.warning("%s: undecodable reply from learner: %s", self.robot_id, exc)
                continue
            if msg.kind == "ack":
                ack = msg.body
                if ack.stream_epoch == self.epoch:
                    self.welcomed = True
                    self.unacked.pop(ack.seq, None)
                    self.step_credit = ack.step_credit
                    self.learner_version = ack.policy_version
            elif msg.kind == "reject":
                self.rejects[msg.body.reason.split(":")[0]] += 1
                log.warning("%s: learner rejected a message: %s", self.robot_id, msg.body.reason)
            elif msg.kind == "command" and msg.body.kind == pb.Command.KIND_STOP:
                self.stop_requested = True
        return handled

    def close(self) -> None:
        self.socket.close(0)
