"""A buffer write error (the disk is full) is never acked: a live ingest and a real DEALER edge,
ENOSPC injected at the OS call mid-stream. Every ack the edge ever got covers batches that are
in the buffer after reopening its directory; batches sent after the failure are refused as
`learner_storage_failed` (retryable: the edge keeps them spooled) and never acked; the status
names the error and the buffer directory."""

from __future__ import annotations

import errno
import os
import time

import gymnasium as gym
import numpy as np
import pytest
import zmq

from tests.support.messages import hello_frames
from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.cloud.ingest import Ingest
from user_rl.edge.batching import BatchBuilder
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import Message, decode, encode, envelope

OBS_SPACE = gym.spaces.Dict({"state": gym.spaces.Box(-1.0, 1.0, (3,), np.float32)})
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ROBOT, EPOCH = "disk-0", 5


def hello() -> list[bytes]:
    return hello_frames(ROBOT, EPOCH, OBS_SPACE, ACTION_SPACE)


def batch(seq: int, rows: int = 8) -> list[bytes]:
    builder = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=rows)
    for t in range((seq - 1) * rows, seq * rows):
        builder.add(
            {"state": np.full(3, (t % 100) / 100, np.float32)},
            np.zeros(2, np.float32),
            1.0,
            False,
            False,
            episode=0,
            step=t,
            policy_version=0,
            actor=pb.ACTOR_POLICY,
            label=pb.LABEL_NONE,
            sensor_time=0.0,
        )
    count, cols = builder.take()
    return [
        bytes(f)
        for f in encode(envelope(ROBOT, batch=pb.TransitionBatch(stream_epoch=EPOCH, seq=seq, count=count)), cols)
    ]


class Edge:
    """A real DEALER that records every reply, so no ack can go unseen."""

    def __init__(self, context: zmq.Context, address: str) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)
        self.replies: list[Message] = []

    def send(self, frames: list[bytes]) -> None:
        self.socket.send_multipart(frames)

    def pump(self, ingest: Ingest, seconds: float) -> None:
        """Let the ingest serve (in this thread) and collect replies for a while."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ingest.poll(10)
            while self.socket.poll(0):
                self.replies.append(decode(self.socket.recv_multipart()))

    def acked(self) -> int:
        return max((m.body.seq for m in self.replies if m.kind == "ack"), default=0)

    def rejects(self) -> list[str]:
        return [m.body.reason for m in self.replies if m.kind == "reject"]


def fail_pwrite(real):
    """The segment writer's writes: the disk is full."""

    def pwrite(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return pwrite


def fail_commit_log_sync(real):
    """Only the commit log's sync fails (the segment's succeeds): the batches' records were
    written, never made durable. A store that marks them durable before this sync must still
    not get them acked."""

    def fdatasync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    return fdatasync


@pytest.mark.parametrize("call, make_fault", [("pwrite", fail_pwrite), ("fdatasync", fail_commit_log_sync)])
def test_a_full_disk_is_never_acked_and_is_reported(tmp_path, monkeypatch, call: str, make_fault) -> None:
    context = zmq.Context()
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer")
    ingest.open_buffer(OBS_SPACE, ACTION_SPACE)
    edge = Edge(context, ingest.endpoint)
    try:
        edge.send(hello())
        for seq in range(1, 6):
            edge.send(batch(seq))
        edge.pump(ingest, 1.0)
        assert edge.acked() == 5 and ingest.failure is None and not edge.rejects()

        monkeypatch.setattr(os, call, make_fault(getattr(os, call)))  # the disk fills up mid-stream
        edge.send(batch(6))
        edge.pump(ingest, 0.5)
        for seq in range(7, 10):  # the edge keeps streaming (and heartbeating) into a learner that failed
            edge.send(batch(seq))
            edge.send([bytes(f) for f in encode(envelope(ROBOT, heartbeat=pb.Heartbeat(env_steps=8 * seq)))])
        edge.pump(ingest, 1.0)
        monkeypatch.undo()  # the disk has room again: still nothing is taken until a restart
        edge.send(batch(10))
        edge.send(hello())
        edge.pump(ingest, 0.5)

        report = ingest.report()
        print(f"\n[{call}] failure: {report['failure']}\nacked: {edge.acked()}, rejects: {len(edge.rejects())}")
        assert "ENOSPC" in report["failure"] and str(tmp_path / "buffer") in report["failure"]
        assert edge.acked() == 5  # nothing after the failure was acked
        refused = [r for r in edge.rejects() if r.startswith("learner_storage_failed")]
        assert len(refused) >= 6 and "ENOSPC" in refused[-1]  # batches 7..10, heartbeats and the hello
        assert ingest.rejected["learner_storage_failed"] == len(refused)
    finally:
        edge.socket.close(0)
        ingest.close()
        context.term()

    # Reopened (as a restarted learner would): every ack covers a batch that is on disk.
    buffer = PersistentReplay(tmp_path / "buffer", OBS_SPACE, ACTION_SPACE)
    try:
        stored = {seq for robot, epoch, seq in buffer.batch_keys() if (robot, epoch) == (ROBOT, EPOCH)}
        assert set(range(1, edge.acked() + 1)) <= stored, stored
        assert not stored & set(range(7, 11))  # refused at the door: never written
    finally:
        buffer.close()
