"""Hostile input against a live ingest: thousands of generated messages (random bytes, truncated
and bit-flipped batches, wrong protocol versions and types, huge or negative declared shapes,
NaNs, out-of-order sequence numbers, spoofed robot ids, absurd hellos). The ingest keeps serving
an honest robot throughout, and the buffer holds only valid data."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
import zmq
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.messages import hello_frames
from user_rl.cloud.ingest import Ingest
from user_rl.edge.batching import BatchBuilder
from user_rl.testing.wait import serving
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import PROTOCOL_VERSION, decode, encode, envelope

OBS_SPACE = gym.spaces.Dict({"state": gym.spaces.Box(-1.0, 1.0, (3,), np.float32)})
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def hello(robot_id: str, epoch: int) -> list[bytes]:
    return hello_frames(robot_id, epoch, OBS_SPACE, ACTION_SPACE, model="fuzz")


def batch(robot_id: str, epoch: int, seq: int, rows: int = 4, start: int = 0) -> list[bytes]:
    """`rows` valid transitions: state values in [0, 1), actions of +-0.5, episodes of 10 steps."""
    builder = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=rows)
    for t in range(start, start + rows):
        ends = t % 10 == 9
        obs = {"state": np.full(3, (t % 100) / 100, np.float32)}
        builder.add(
            obs,
            np.array([0.5, -0.5], np.float32),
            1.0,
            False,
            ends,
            episode=t // 10,
            step=t % 10,
            policy_version=0,
            actor=pb.ACTOR_POLICY,
            label=pb.LABEL_NONE,
            sensor_time=0.0,
            final_obs=obs if ends else None,
        )
    count, cols = builder.take()
    body = pb.TransitionBatch(stream_epoch=epoch, seq=seq, count=count)
    return [bytes(f) for f in encode(envelope(robot_id, batch=body), cols)]


# -- generated messages --------------------------------------------------------------------------

NEXT_SEQ = {"fuzz-0": 1}  # kept up to date from the live ingest while the fuzz runs
raw_frames = st.lists(st.binary(max_size=300), min_size=1, max_size=5)
dtypes = st.sampled_from(["float32", "float64", "uint8", "int64", "bool", "complex128", "object", "<U8", "", "f"])
shapes = st.lists(st.integers(-4, 2**40), max_size=10)
bounds = st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=6)


@st.composite
def absurd_hellos(draw) -> list[bytes]:
    """Hellos whose spaces, ids and strings are anything at all."""
    robot_id = draw(st.one_of(st.text(max_size=300), st.just("fuzz-0")))
    obs = {
        draw(st.text(max_size=200)): pb.BoxSpace(
            dtype=draw(dtypes), shape=draw(shapes), low=draw(bounds), high=draw(bounds)
        )
        for _ in range(draw(st.integers(0, 3)))
    }
    action = pb.BoxSpace(dtype=draw(dtypes), shape=draw(shapes), low=draw(bounds), high=draw(bounds))
    body = pb.Hello(
        descriptor=pb.Descriptor(
            kind=draw(st.text(max_size=50)), id=robot_id, instruction=draw(st.text(max_size=5000))
        ),
        observation_space=obs,
        action_space=action,
        stream_epoch=draw(st.integers(0, 2**64 - 1)),
    )
    env = envelope(robot_id, hello=body)
    env.protocol_version = draw(st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION, 0, 2, 2**31 - 1]))
    return [env.SerializeToString()]


@st.composite
def mutated_batches(draw) -> list[bytes]:
    """A valid batch of the fuzz robot, then broken in one or more ways."""
    # Mostly the sequence number the ingest expects next (so damage meets the deepest checks), else any.
    seq = draw(st.one_of(st.just(NEXT_SEQ["fuzz-0"]), st.just(NEXT_SEQ["fuzz-0"]), st.integers(0, 40)))
    frames = batch("fuzz-0", 1, seq, rows=draw(st.integers(1, 12)))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(
            st.sampled_from(["truncate", "flip", "drop", "extra", "respec", "nan", "version", "count", "spoof", "kind"])
        )
        if not frames:
            break
        env = pb.Envelope()
        try:
            env.ParseFromString(frames[0])
        except DecodeError:  # an earlier mutation broke the envelope: that is damage enough
            break
        if how == "truncate":
            i = draw(st.integers(0, len(frames) - 1))
            frames[i] = frames[i][: draw(st.integers(0, max(0, len(frames[i]) - 1)))]
            continue
        if how == "flip":
            i = draw(st.integers(0, len(frames) - 1))
            data = bytearray(frames[i])
            for _ in range(draw(st.integers(1, 8))):
                if data:
                    data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
            frames[i] = bytes(data)
            continue
        if how == "drop":
            frames.pop(draw(st.integers(0, len(frames) - 1)))
            continue
        if how == "extra":
            frames.append(draw(st.binary(max_size=64)))
            continue
        if how == "respec" and env.arrays:  # declare another dtype or a huge / negative shape
            spec = env.arrays[draw(st.integers(0, len(env.arrays) - 1))]
            spec.dtype = draw(dtypes)
            del spec.shape[:]
            spec.shape.extend(draw(shapes))
        elif how == "nan" and env.arrays and len(frames) == len(env.arrays) + 1:  # NaN / inf, valid envelope
            names = [a.name for a in env.arrays]
            i = draw(st.integers(0, len(names) - 1))
            if env.arrays[i].dtype == "float32" and len(frames[i + 1]) % 4 == 0:
                values = np.frombuffer(frames[i + 1], np.float32).copy()
                if values.size:
                    values[draw(st.integers(0, values.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
                    frames[i + 1] = values.tobytes()
        elif how == "version":
            env.protocol_version = draw(st.integers(0, 2**32 - 1))
        elif how == "count":
            env.batch.count = draw(st.integers(0, 2**32 - 1))
        elif how == "spoof":
            env.robot_id = draw(st.sampled_from(["good-0", "", "x" * 500]))
        elif how == "kind":
            env.heartbeat.env_steps = draw(st.integers(0, 2**62))
        frames[0] = env.SerializeToString()
    return frames or [b""]


@st.composite
def poisoned_batches(draw) -> list[bytes]:
    """A batch the ingest expects next, valid but for one NaN / inf / 1e30, or a huge episode number."""
    count, columns = decode_batch(batch("fuzz-0", 1, NEXT_SEQ["fuzz-0"], rows=draw(st.integers(1, 12))))
    name = draw(st.sampled_from(["obs/state", "reward", "action", "episode"]))
    column = columns[name]
    row = draw(st.integers(0, count - 1))
    if name == "episode":
        column[row] = draw(st.integers(2**63, 2**64 - 1))
    else:
        column.reshape(count, -1)[row, 0] = draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e30]))
    body = pb.TransitionBatch(stream_epoch=1, seq=NEXT_SEQ["fuzz-0"], count=count)
    return [bytes(f) for f in encode(envelope("fuzz-0", batch=body), columns)]


def decode_batch(frames: list[bytes]) -> tuple[int, dict[str, np.ndarray]]:
    msg = decode(frames)
    return msg.body.count, {name: array.copy() for name, array in msg.arrays.items()}


fuzz_messages = st.one_of(raw_frames, absurd_hellos(), mutated_batches(), poisoned_batches())


# -- the live ingest -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    context = zmq.Context()
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path_factory.mktemp("fuzz") / "buffer", max_messages_per_s=1e6)
    with serving(lambda: ingest.poll(20)) as crashed:  # the test fails if the serving loop ever dies
        fuzzer = context.socket(zmq.DEALER)
        fuzzer.setsockopt(zmq.LINGER, 0)
        fuzzer.connect(ingest.endpoint)
        fuzzer.send_multipart(hello("fuzz-0", 1))  # so mutated batches get as far as validation
        assert fuzzer.poll(5000) and decode(fuzzer.recv_multipart()).kind == "ack"
        honest = context.socket(zmq.DEALER)
        honest.setsockopt(zmq.LINGER, 0)
        honest.connect(ingest.endpoint)
        yield {"ingest": ingest, "fuzzer": fuzzer, "honest": honest, "crashed": crashed, "sent": [0]}
    fuzzer.close(0)
    honest.close(0)
    ingest.close()
    context.term()


def drain(socket: zmq.Socket) -> None:
    while socket.poll(0):
        socket.recv_multipart()


@settings(
    max_examples=3000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(message=fuzz_messages)
def test_generated_hostile_messages(live, message: list[bytes]) -> None:
    live["fuzzer"].send_multipart(message)
    live["sent"][0] += 1
    if live["sent"][0] % 50 == 0:
        drain(live["fuzzer"])
        session = live["ingest"].robots.get("fuzz-0")
        NEXT_SEQ["fuzz-0"] = session.stream.record.last_seq + 1 if session else 1
        assert not live["crashed"], live["crashed"]


def test_after_the_fuzz_the_ingest_serves_an_honest_robot_and_stored_only_valid_data(live) -> None:
    ingest, honest = live["ingest"], live["honest"]
    assert live["sent"][0] >= 3000
    time.sleep(1.0)  # let the ingest work through its queue
    assert not live["crashed"], live["crashed"]
    assert sum(ingest.rejected.values()) >= 1000, dict(ingest.rejected)
    # Every kind of damage was met and named.
    for reason in (
        "undecodable",
        "wrong_version",
        "frame_count",
        "frame_size",
        "bad_hello",
        "non_finite",
        "bad_episode",
    ):
        assert ingest.rejected[reason] > 0, (reason, dict(ingest.rejected))

    honest.send_multipart(hello("good-0", 7))
    assert honest.poll(5000) and decode(honest.recv_multipart()).kind == "ack"
    for seq in range(1, 11):
        honest.send_multipart(batch("good-0", 7, seq, rows=10, start=10 * (seq - 1)))
    deadline = time.monotonic() + 10
    acked = 0
    while acked < 10 and time.monotonic() < deadline:
        if honest.poll(100):
            msg = decode(honest.recv_multipart())
            assert msg.kind == "ack", msg
            acked = max(acked, msg.body.seq)
    assert acked == 10, "the honest robot's batches were not all stored"
    assert ingest.robots["good-0"].transitions == 100

    # Whatever got in is valid: the declared dtypes and shapes, finite, actions inside the action space.
    # (A bit-flipped but finite observation of the fuzz robot is valid data by that contract.)
    sample = ingest.buffer.sample(4096, np.random.default_rng(0))
    assert sample["obs/state"].dtype == np.float32 and sample["obs/state"].shape == (4096, 3)
    assert np.isfinite(sample["obs/state"]).all() and np.isfinite(sample["next_obs/state"]).all()
    assert np.isfinite(sample["action"]).all() and (np.abs(sample["action"]) <= 1).all()
    assert np.isfinite(sample["reward"]).all()
    honest_rows = sample["robot"] == ingest.robots["good-0"].stream.record.id
    assert honest_rows.any()  # and the honest robot's rows are exactly what it sent
    assert ((sample["obs/state"][honest_rows] >= 0) & (sample["obs/state"][honest_rows] < 1)).all()
    assert (sample["reward"][honest_rows] == 1.0).all()
    assert {robot for robot, _, _ in ingest.buffer.batch_keys()} <= {"fuzz-0", "good-0"}


def test_a_flooding_peer_is_rate_limited_and_the_rest_are_served(tmp_path) -> None:
    context = zmq.Context()
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer", max_messages_per_s=200)
    flood, honest = (context.socket(zmq.DEALER) for _ in range(2))
    for socket, name in ((flood, b"flood"), (honest, b"honest")):
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.ROUTING_ID, name)
        socket.connect(ingest.endpoint)
    try:
        for _ in range(5000):  # garbage, far above 200 messages/s
            flood.send_multipart([b"\x08\x01 garbage"])
        honest.send_multipart(hello("good-0", 1))
        for seq in range(1, 6):
            honest.send_multipart(batch("good-0", 1, seq, rows=10, start=10 * (seq - 1)))
        deadline, acked = time.monotonic() + 10, 0
        while acked < 5 and time.monotonic() < deadline:
            ingest.poll(20)
            while honest.poll(0):
                msg = decode(honest.recv_multipart())
                acked = max(acked, msg.body.seq if msg.kind == "ack" else 0)
        assert acked == 5, "the honest robot was starved"
        started = time.monotonic()
        while ingest.poll(200):  # work through the rest of the flood
            pass
        elapsed = time.monotonic() - started
        replies = 0
        while flood.poll(100):
            flood.recv_multipart()
            replies += 1
        report = ingest.guard.report()
        flood_report = report["flood"]
        assert flood_report["rate_limited"] + flood_report["undecodable"] == 5000
        assert flood_report["undecodable"] <= 200 * (elapsed + 12) + 200  # read no faster than its budget
        assert flood_report["rate_limited"] > 1000  # the rest was dropped unread
        assert 0 < replies <= 50 + 10 * (elapsed + 12) < flood_report["undecodable"]  # told, not at its rate
        assert "honest" not in report
    finally:
        flood.close(0)
        honest.close(0)
        ingest.close()
        context.term()
