"""A live ingest under hostile load stays bounded: small messages cannot make it allocate much
(hellos declaring huge spaces, PNG batches declaring huge or many images, a message over the
limit in many frames), and thousands of robots or unknown keys leave its memory and status
bounded. Memory is measured around each call (tracemalloc peak, RSS from /proc/self/status)
and printed (`pytest -s`); bounds are derived from the limits, generously."""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

import cv2
import gymnasium as gym
import numpy as np
import pytest
import zmq

from user_rl.cloud.ingest import FORGET_CHECK_S, Ingest
from user_rl.cloud.peer_guard import OTHER_PEERS, PeerGuard
from user_rl.security.curve import MAX_DENIED_SHOWN, ClientKeys, Gatekeeper
from user_rl.security.keys import KeyPair, generate
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import Message, decode, encode, envelope
from user_rl.wire.spaces import MAX_OBSERVATION_KEYS, box_to_proto, dict_space_to_proto

MiB = 2**20
OBS_SPACE = gym.spaces.Dict(
    {"image": gym.spaces.Box(0, 255, (480, 640, 3), np.uint8), "state": gym.spaces.Box(-1.0, 1.0, (3,), np.float32)}
)
SMALL_OBS = gym.spaces.Dict({"state": gym.spaces.Box(-1.0, 1.0, (3,), np.float32)})
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def rss_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@contextmanager
def measured(label: str) -> Iterator[dict]:
    """Python allocations' peak (tracemalloc, numpy included) and RSS growth of the block."""
    numbers: dict = {}
    rss = rss_mib()
    tracemalloc.start()
    try:
        yield numbers
        numbers["peak_mib"] = tracemalloc.get_traced_memory()[1] / MiB
    finally:
        tracemalloc.stop()
    numbers["rss_growth_mib"] = rss_mib() - rss
    print(
        f"\n{label}: tracemalloc peak {numbers['peak_mib']:.2f} MiB, RSS {rss:.0f} -> "
        f"{rss + numbers['rss_growth_mib']:.0f} MiB (+{numbers['rss_growth_mib']:.1f})"
    )


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(0)


class Peer:
    """A bare DEALER; the ingest is served from the test's own thread, so its allocations are measured."""

    def __init__(self, context: zmq.Context, ingest: Ingest) -> None:
        self.ingest = ingest
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(ingest.endpoint)

    def ask(self, frames) -> Message:
        self.socket.send_multipart(list(frames))
        return self.reply()

    def reply(self) -> Message:
        deadline = time.monotonic() + 10
        while not self.socket.poll(0):
            assert time.monotonic() < deadline, "no reply from the ingest"
            self.ingest.poll(10)
        return decode(self.socket.recv_multipart())

    def expect_reject(self, frames, reason: str) -> str:
        reply = self.ask(frames)
        assert reply.kind == "reject" and reply.body.reason.startswith(reason + ":"), reply
        return reply.body.reason

    def expect_refused(self, frames, reason: str) -> str:
        """A batch refused for its content: acked as refused (quarantined, its seq taken), with why."""
        reply = self.ask(frames)
        while reply.kind == "ack" and not reply.body.refused_seq:  # a group commit's cumulative ack
            reply = self.reply()
        assert reply.kind == "ack" and reply.body.refused_reason.startswith(reason + ":"), reply
        return reply.body.refused_reason


def hello(robot_id: str, epoch: int, obs: dict[str, pb.BoxSpace], action: pb.BoxSpace) -> list[bytes]:
    body = pb.Hello(
        descriptor=pb.Descriptor(kind="sim", model="test", id=robot_id),
        observation_space=obs,
        action_space=action,
        stream_epoch=epoch,
    )
    return [bytes(f) for f in encode(envelope(robot_id, hello=body))]


def good_hello(robot_id: str, epoch: int, obs_space: gym.spaces.Dict = OBS_SPACE) -> list[bytes]:
    return hello(robot_id, epoch, dict_space_to_proto(obs_space), box_to_proto(ACTION_SPACE))


def huge(dtype: str = "uint8", shape=(2048, 2048, 4)) -> pb.BoxSpace:
    """2**24 elements (the most one entry may declare), in a few bytes."""
    return pb.BoxSpace(dtype=dtype, shape=shape, low=[0.0], high=[255.0])


# -- hellos --------------------------------------------------------------------------------------


def test_hostile_hellos_are_refused_before_anything_their_size_is_built(context, tmp_path) -> None:
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer")
    ingest.open_buffer(OBS_SPACE, ACTION_SPACE)  # a learner knows its spaces (from its config)
    peer = Peer(context, ingest)
    fleet_obs, fleet_action = dict_space_to_proto(OBS_SPACE), box_to_proto(ACTION_SPACE)
    hostile = {
        "a huge image": ({**fleet_obs, "image": huge()}, fleet_action),
        "64 huge keys": ({f"cam{i}": huge() for i in range(MAX_OBSERVATION_KEYS)}, fleet_action),
        "a huge float64 action": (fleet_obs, huge("float64", (1 << 24,))),
        "the image as float64": ({**fleet_obs, "image": huge("float64", (480, 640, 3))}, fleet_action),
    }
    try:
        for name, (obs, action) in hostile.items():
            frames = hello("evil-0", 1, obs, action)
            with measured(f"hello with {name} ({sum(map(len, frames))} bytes)") as used:
                reason = peer.expect_reject(frames, "spaces_mismatch")
            print("  ->", reason)
            assert used["peak_mib"] < 4, name  # the message is a few KiB; the old path built GiBs
        too_many = {f"k{i}": box_to_proto(OBS_SPACE["state"]) for i in range(MAX_OBSERVATION_KEYS + 1)}
        assert "65 observation keys" in peer.expect_reject(hello("evil-0", 1, too_many, fleet_action), "bad_hello")
        assert ingest.robots == {} and ingest.rejected["spaces_mismatch"] == len(hostile)
        fleet_hello = good_hello("arm-0", 1)
        with measured("the fleet's own hello") as used:
            assert peer.ask(fleet_hello).kind == "ack"
        assert used["peak_mib"] < 4  # its bounds compared in place with the known ones
    finally:
        peer.socket.close(0)
        ingest.close()


def test_a_fresh_ingest_takes_no_spaces_bigger_than_a_message_can_carry(context, tmp_path) -> None:
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer", max_message_bytes=8 * MiB)
    peer = Peer(context, ingest)
    try:
        frames = hello("evil-0", 1, {"image": huge()}, box_to_proto(ACTION_SPACE))
        with measured("first hello declaring 16 MiB per step, 8 MiB messages") as used:
            reason = peer.expect_reject(frames, "bad_hello")
        print("  ->", reason)
        assert "16.0 MiB per step" in reason and "learner.max_message_mb" in reason
        assert used["peak_mib"] < 4 and ingest.buffer is None
        assert peer.ask(good_hello("arm-0", 1)).kind == "ack" and ingest.obs_space == OBS_SPACE
    finally:
        peer.socket.close(0)
        ingest.close()


# -- compressed images ---------------------------------------------------------------------------


def png(height: int, width: int) -> np.ndarray:
    ok, data = cv2.imencode(".png", np.zeros((height, width, 3), np.uint8), [cv2.IMWRITE_PNG_COMPRESSION, 9])
    assert ok
    return data.reshape(-1)


def png_batch(count: int, frames: list[np.ndarray], seq: int = 1) -> list[bytes]:
    """`count` valid rows whose obs/image travels as these PNG frames."""
    cols = {
        "obs/state": np.zeros((count, 3), np.float32),
        "action": np.zeros((count, 2), np.float32),
        "reward": np.zeros(count, np.float32),
        "terminated": np.zeros(count, bool),
        "truncated": np.zeros(count, bool),
        "episode": np.zeros(count, np.uint64),
        "step": np.arange(count, dtype=np.int64) + (seq - 1) * count,
        "policy_version": np.zeros(count, np.int64),
        "actor": np.zeros(count, np.uint8),
        "label": np.zeros(count, np.uint8),
        "sensor_time": np.zeros(count, np.float64),
        "obs/image#png": np.concatenate(frames),
        "obs/image#sizes": np.array([len(f) for f in frames], np.int64),
    }
    body = pb.TransitionBatch(stream_epoch=1, seq=seq, count=count)
    return [bytes(f) for f in encode(envelope("cam-0", batch=body), cols)]


def test_png_batches_decode_no_more_than_their_count_and_the_limit_allow(context, tmp_path) -> None:
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer", max_message_bytes=8 * MiB)
    ingest.open_buffer(OBS_SPACE, ACTION_SPACE)
    peer = Peer(context, ingest)
    frame = png(480, 640)  # one 900 KiB image in about 1 KiB
    limit = 4 * 8 * MiB  # what one message may decode to: 4x max_message_bytes
    cases = {  # each refused for its content: quarantined, its seq taken
        "2 rows, 300 frames": (png_batch(2, [frame] * 300, seq=1), "300 frames in a batch of 2 rows"),
        "2 rows, 4000x4000 frames": (
            png_batch(2, [png(4000, 4000)] * 2, seq=2),
            "is not an 8-bit png image of 480x640",
        ),
        "100 rows, 100 frames": (
            png_batch(100, [frame] * 100, seq=3),
            "would decode to 87.9 MiB, more than the 32 MiB",
        ),
    }
    try:
        assert peer.ask(good_hello("cam-0", 1)).kind == "ack"
        for name, (frames, why) in cases.items():
            with measured(f"PNG batch of {name} ({sum(map(len, frames)) / 1024:.0f} KiB)") as used:
                reason = peer.expect_refused(frames, "bad_image")
            print("  ->", reason)
            assert why in reason
            assert used["peak_mib"] < 8  # nothing decoded (the 300 frames alone would be 264 MiB)
        with measured("PNG batch of 20 rows, 20 frames (stored)") as used:
            reply = peer.ask(png_batch(20, [frame] * 20, seq=4))
            while reply.body.seq < 4:  # a group commit's ack of the refusals came first
                reply = peer.reply()
        assert used["peak_mib"] < 3 * limit  # decoded once (17.6 MiB) and copied into the buffer
        assert ingest.robots["cam-0"].transitions == 20
    finally:
        peer.socket.close(0)
        ingest.close()


# -- messages over the limit -----------------------------------------------------------------------


def test_a_message_over_the_limit_in_many_frames_is_dropped_and_the_peer_told(context, tmp_path) -> None:
    wide = gym.spaces.Dict({f"s{i}": gym.spaces.Box(-1.0, 1.0, (32768,), np.float32) for i in range(8)})
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer", max_message_bytes=4 * MiB)
    peer = Peer(context, ingest)

    def batch(rows: int) -> list[bytes]:  # 1 MiB per row over 8 frames of 128 KiB per row
        cols = {f"obs/s{i}": np.zeros((rows, 32768), np.float32) for i in range(8)}
        cols |= {
            "action": np.zeros((rows, 2), np.float32),
            "reward": np.zeros(rows, np.float32),
            "terminated": np.zeros(rows, bool),
            "truncated": np.zeros(rows, bool),
            "episode": np.zeros(rows, np.uint64),
            "step": np.arange(rows, dtype=np.int64),
            "policy_version": np.zeros(rows, np.int64),
            "actor": np.zeros(rows, np.uint8),
            "label": np.zeros(rows, np.uint8),
            "sensor_time": np.zeros(rows, np.float64),
        }
        return [
            bytes(f)
            for f in encode(envelope("wide-0", batch=pb.TransitionBatch(stream_epoch=1, seq=1, count=rows)), cols)
        ]

    try:
        assert peer.ask(good_hello("wide-0", 1, wide)).kind == "ack"
        frames = batch(6)  # every frame under 4 MiB, 6 MiB in all
        assert max(map(len, frames)) < 4 * MiB < sum(map(len, frames))
        with measured(f"{len(frames)}-frame message of {sum(map(len, frames)) / MiB:.1f} MiB, 4 MiB limit") as used:
            reason = peer.expect_reject(frames, "message_too_large")
        print("  ->", reason)
        assert "counted over all frames" in reason and ingest.rejected["message_too_large"] == 1
        assert used["peak_mib"] < 4  # its frames were read and dropped, not kept or decoded
        assert ingest.robots["wide-0"].transitions == 0
        ack = peer.ask(batch(3))  # the same peer's next message, under the limit, is read whole
        assert ack.kind == "ack" and ack.body.seq == 1 and ingest.robots["wide-0"].transitions == 3
    finally:
        peer.socket.close(0)
        ingest.close()


# -- many robots, many keys ----------------------------------------------------------------------


def test_ten_thousand_robot_epochs_leave_the_ingest_bounded(context, tmp_path) -> None:
    max_robots, forget_idle_s, n = 100, 2.0, 10_000
    ingest = Ingest(
        context, "tcp://127.0.0.1:0", tmp_path / "buffer", max_robots=max_robots, forget_idle_s=forget_idle_s
    )
    ingest.open_buffer(SMALL_OBS, ACTION_SPACE)
    peers = [Peer(context, ingest) for _ in range(20)]  # 500 hellos each, within each peer's message budget
    rss_before, started = rss_mib(), time.monotonic()
    try:
        for k, peer in enumerate(peers):
            per_peer = n // len(peers)
            for i in range(k * per_peer, (k + 1) * per_peer):
                peer.socket.send_multipart(good_hello(f"r-{i}", i + 1, SMALL_OBS))
            answered, deadline = 0, time.monotonic() + 60
            while answered < per_peer:
                assert time.monotonic() < deadline, f"{answered} of {per_peer} hellos answered"
                ingest.poll(10, max_messages=1000)
                while peer.socket.poll(0):
                    assert decode(peer.socket.recv_multipart()).kind == "ack"
                    answered += 1
            assert len(ingest.robots) <= max_robots
        report = json.dumps(ingest.report())
        streams = len(ingest.buffer.streams)
        print(
            f"\n{n} robot epochs in {time.monotonic() - started:.1f} s: RSS {rss_before:.0f} -> {rss_mib():.0f} MiB; "
            f"robots kept {len(ingest.robots)}, forgotten {ingest.forgotten}, status {len(report) / 1024:.0f} KiB, "
            f"buffer.streams {streams}"
        )
        assert len(ingest.robots) == max_robots and ingest.forgotten == n - max_robots
        assert len(report) < max_robots * 1024 + 16 * 1024  # per robot ~0.7 KiB in the status
        if hasattr(ingest.buffer, "release_stream"):  # forgotten robots' streams leave the buffer's memory too
            ingest.maybe_commit(force=True)
            assert len(ingest.buffer.streams) <= max_robots + 1, len(ingest.buffer.streams)

        # A forgotten robot comes back: it says hello again and continues its stream.
        back = peers[0]
        assert "r-0" not in ingest.robots
        assert back.ask(good_hello("r-0", 1, SMALL_OBS)).kind == "ack"
        rows = {
            "obs/state": np.zeros((4, 3), np.float32),
            "action": np.zeros((4, 2), np.float32),
            "reward": np.zeros(4, np.float32),
            "terminated": np.zeros(4, bool),
            "truncated": np.zeros(4, bool),
            "episode": np.zeros(4, np.uint64),
            "step": np.arange(4, dtype=np.int64),
            "policy_version": np.zeros(4, np.int64),
            "actor": np.zeros(4, np.uint8),
            "label": np.zeros(4, np.uint8),
            "sensor_time": np.zeros(4, np.float64),
        }
        ack = back.ask(encode(envelope("r-0", batch=pb.TransitionBatch(stream_epoch=1, seq=1, count=4)), rows))
        assert ack.kind == "ack" and ack.body.seq == 1 and ingest.robots["r-0"].transitions == 4

        # Idle robots age out of memory and the status.
        deadline = time.monotonic() + forget_idle_s + FORGET_CHECK_S + 10
        while ingest.robots:
            assert time.monotonic() < deadline, f"{len(ingest.robots)} idle robots still kept"
            ingest.poll(50)
        assert ingest.report()["robots"] == {} and ingest.report()["robots_forgotten"] == n + 1
        print(f"after {forget_idle_s:g} s idle: robots kept 0, RSS {rss_mib():.0f} MiB")
    finally:
        for peer in peers:
            peer.socket.close(0)
        ingest.close()


def test_ten_thousand_unknown_keys_leave_the_gatekeeper_bounded(context, tmp_path) -> None:
    keys = tmp_path / "keys"
    generate(keys, ["arm-0"])
    gate = Gatekeeper(context, keys)
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer", gate=gate)
    ingest.open_buffer(SMALL_OBS, ACTION_SPACE)
    n, wave = 10_000, 250
    rss_before, started = rss_mib(), time.monotonic()
    try:
        for first in range(0, n, wave):
            sockets = []
            for i in range(first, first + wave):
                socket = context.socket(zmq.DEALER)
                socket.setsockopt(zmq.LINGER, 0)
                socket.setsockopt(zmq.RECONNECT_IVL, 60_000)  # one handshake each
                public, secret = zmq.curve_keypair()
                ClientKeys(KeyPair(public, secret), gate.keys.public).apply(socket)
                socket.connect(ingest.endpoint)
                try:  # queued until the handshake, which the gatekeeper refuses
                    socket.send_multipart(good_hello(f"stranger-{i}", 1, SMALL_OBS), flags=zmq.DONTWAIT)
                except zmq.Again:  # refused already, between connect and send (a busy CPU): nowhere to queue it
                    pass
                sockets.append(socket)
            deadline = time.monotonic() + 60
            while gate.denied_total < first + wave:
                assert time.monotonic() < deadline, f"{gate.denied_total} handshakes refused of {first + wave}"
                ingest.poll(10)
            for socket in sockets:
                socket.close(0)
        shown, total = gate.denied_report()
        report = ingest.report()
        size = len(json.dumps(report))
        print(
            f"\n{n} unknown keys in {time.monotonic() - started:.1f} s: RSS {rss_before:.0f} -> {rss_mib():.0f} MiB; "
            f"refusals {total}, keys named {len(shown)}, status {size / 1024:.1f} KiB"
        )
        assert total >= n and len(gate.denied) <= MAX_DENIED_SHOWN and len(report["keys_refused"]) <= MAX_DENIED_SHOWN
        assert report["keys_refused_total"] >= n and size < 16 * 1024
        assert ingest.robots == {} and report["rejected"] == {}  # nothing got past the handshake

        # The enrolled robot still gets in.
        robot = context.socket(zmq.DEALER)
        robot.setsockopt(zmq.LINGER, 0)
        ClientKeys.for_robot(keys, "arm-0").apply(robot)
        robot.connect(ingest.endpoint)
        robot.send_multipart(good_hello("arm-0", 1, SMALL_OBS))
        deadline = time.monotonic() + 10
        while not robot.poll(0):
            assert time.monotonic() < deadline, "the enrolled robot was not answered"
            ingest.poll(10)
        assert decode(robot.recv_multipart()).kind == "ack"
        robot.close(0)
    finally:
        ingest.close()
        gate.close()


def test_rejections_name_a_bounded_number_of_peers() -> None:
    guard = PeerGuard(rate_per_s=100.0, max_named=64)
    for i in range(10_000):
        guard.reject(f"peer-{i}".encode(), "undecodable")
    report = guard.report()
    assert len(report) == 65 and report[OTHER_PEERS]["undecodable"] == 10_000 - 64
    assert sum(c["undecodable"] for c in report.values()) == 10_000
