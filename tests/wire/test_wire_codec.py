"""Codec: every envelope body round-trips with its arrays; broken messages and batches raise
WireError with a stable reason."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from user_rl.edge.batching import BatchBuilder
from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import PROTOCOL_VERSION, WireError, decode, encode, envelope, message_fields
from user_rl.wire.spaces import (
    box_from_proto,
    box_to_proto,
    descriptor_from_proto,
    descriptor_to_proto,
    dict_space_from_proto,
    dict_space_to_proto,
)
from user_rl.wire.transitions import validate_batch

IMAGE = gym.spaces.Box(0, 255, (8, 6, 3), np.uint8)
STATE = gym.spaces.Box(
    low=np.array([-1.0, -2.0, 0.0, -0.5], np.float32),
    high=np.array([1.0, 2.0, 3.0, 0.5], np.float32),
    dtype=np.float32,
)
ACTION = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
OBS_SPACE = gym.spaces.Dict({"image": IMAGE, "state": STATE})


def roundtrip(env: pb.Envelope, arrays: dict[str, np.ndarray] | None = None):
    """Encode, copy every frame to bytes (as if it crossed a socket), decode."""
    frames = [bytes(f) for f in encode(env, arrays)]
    return decode(frames)


def test_every_body_kind_is_covered() -> None:
    # If someone adds a body to the oneof, this test module must learn it too.
    oneof = pb.Envelope.DESCRIPTOR.oneofs_by_name["body"]
    assert {f.name for f in oneof.fields} == {
        "hello",
        "heartbeat",
        "batch",
        "ack",
        "reject",
        "weights_request",
        "weights_announce",
        "weights_chunk",
        "command",
        "status_request",
        "status_reply",
    }


def test_hello_with_descriptor_and_spaces() -> None:
    desc = DeviceDescriptor(
        kind="sim", model="reach", id="arm-7", control_hz=25.0, instruction="reach the ball", cameras=("wrist", "front")
    )
    hello = pb.Hello(
        descriptor=descriptor_to_proto(desc),
        observation_space=dict_space_to_proto(OBS_SPACE),
        action_space=box_to_proto(ACTION),
        stream_epoch=2**63 + 5,
        policy_version=-1,
    )
    msg = roundtrip(envelope("arm-7", hello=hello))
    assert msg.kind == "hello"
    assert msg.envelope.protocol_version == PROTOCOL_VERSION
    assert msg.envelope.robot_id == "arm-7"
    assert msg.arrays == {}
    body = msg.body
    assert body.stream_epoch == 2**63 + 5 and body.policy_version == -1
    assert descriptor_from_proto(body.descriptor) == desc

    obs = dict_space_from_proto(body.observation_space)
    assert set(obs.spaces) == {"image", "state"}
    assert obs == OBS_SPACE
    image = obs["image"]
    assert image.dtype == np.uint8 and image.shape == (8, 6, 3)
    assert np.all(image.low == 0) and np.all(image.high == 255)
    state = obs["state"]
    assert state.dtype == np.float32 and state.shape == (4,)
    np.testing.assert_array_equal(state.low, STATE.low)  # per-element bounds survive
    np.testing.assert_array_equal(state.high, STATE.high)
    assert box_from_proto(body.action_space) == ACTION
    # A uniform box is sent as one bound, a per-element one in full.
    assert len(body.observation_space["image"].low) == 1
    assert len(body.observation_space["state"].low) == 4


def test_heartbeat() -> None:
    hb = pb.Heartbeat(
        time=1234.5, env_steps=10_000, episodes=7, policy_version=3, unacked_batches=2, steps_per_second=512.25
    )
    msg = roundtrip(envelope("r", heartbeat=hb))
    assert msg.kind == "heartbeat"
    assert msg.body == hb


def test_message_fields_are_the_schemas_names_with_defaults_and_plain_maps() -> None:
    fields = message_fields(pb.Heartbeat(env_steps=5, safety_violations={"clipped": 2}))
    assert fields["env_steps"] == 5 and fields["health"] == "" and fields["inference_ms"] == 0.0
    assert fields["safety_violations"] == {"clipped": 2} and type(fields["safety_violations"]) is dict
    assert set(fields) == {f.name for f in pb.Heartbeat.DESCRIPTOR.fields}


def test_batch_arrays_survive_exactly() -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "obs/image": rng.integers(0, 256, (5, 8, 6, 3), dtype=np.uint8),
        "obs/state": rng.standard_normal((5, 4)).astype(np.float32),
        "action": rng.standard_normal((5, 3)).astype(np.float32),
        "reward": np.array([0.5, -1.0, 0.0, 2.0, 1e-8], np.float32),
        "terminated": np.array([False, False, True, False, False]),
        "episode": np.array([1, 1, 1, 2, 2**64 - 1], np.uint64),
        "step": np.array([0, 1, 2, 0, -3], np.int64),
        "sensor_time": np.array([1.0, 2.0, 3.0, 4.0, 5.0]),
        "half": np.arange(6, dtype=np.float16).reshape(2, 3),
        "i8": np.array([-128, 127], np.int8),
        "scalar": np.array(7, np.int32),  # 0-d
        "final_row": np.zeros(0, np.int64),  # zero-size
        "final_obs/image": np.zeros((0, 8, 6, 3), np.uint8),  # zero-size, 4-d
        "strided": np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2],  # non-contiguous
    }
    batch = pb.TransitionBatch(stream_epoch=9, seq=3, count=5, send_time=99.5)
    msg = roundtrip(envelope("arm-0", batch=batch), arrays)
    assert msg.kind == "batch"
    assert msg.body == batch
    assert list(msg.arrays) == list(arrays)  # order kept
    for name, sent in arrays.items():
        got = msg.arrays[name]
        assert got.dtype == sent.dtype, name
        assert got.shape == sent.shape, name
        np.testing.assert_array_equal(got, sent, err_msg=name)


def test_frames_are_raw_bytes_not_pickles() -> None:
    arr = np.arange(4, dtype=np.int32)
    frames = encode(envelope("r", batch=pb.TransitionBatch(seq=1, count=4)), {"x": arr})
    assert len(frames) == 2
    assert bytes(frames[1]) == arr.tobytes()


def test_ack_reject_weights_and_command() -> None:
    cases = {
        "ack": pb.Ack(stream_epoch=11, seq=42, step_credit=5000, policy_version=-1),
        "reject": pb.Reject(reason="bad_shape: obs/state: [3], expected [4]", seq=17),
        "weights_request": pb.WeightsRequest(have_version=-1),
        "weights_announce": pb.WeightsAnnounce(
            version=4,
            tensors=[
                pb.ArraySpec(name="w", dtype="bfloat16", shape=[3, 2]),
                pb.ArraySpec(name="b", dtype="float32", shape=[2]),
            ],
            total_bytes=20,
            num_chunks=3,
            chunk_bytes=8,
            created_time=3.25,
        ),
        "command": pb.Command(kind=pb.Command.KIND_STOP, detail="operator asked"),
    }
    for kind, body in cases.items():
        msg = roundtrip(envelope("", **{kind: body}))
        assert msg.kind == kind
        assert msg.body == body, kind
        assert msg.arrays == {}


def test_weights_chunk_with_its_frame() -> None:
    payload = np.frombuffer(bytes(range(256)) * 3, np.uint8)
    msg = roundtrip(envelope(weights_chunk=pb.WeightsChunk(version=5, index=2)), {"bytes": payload})
    assert msg.kind == "weights_chunk"
    assert msg.body.version == 5 and msg.body.index == 2
    np.testing.assert_array_equal(msg.arrays["bytes"], payload)
    empty = roundtrip(envelope(weights_chunk=pb.WeightsChunk(version=5, index=0)), {"bytes": np.zeros(0, np.uint8)})
    assert empty.arrays["bytes"].shape == (0,) and empty.arrays["bytes"].dtype == np.uint8


def test_status_request_and_reply_carry_the_fleet_table() -> None:
    from user_rl.cloud.fleet_status import status_from_reply, status_reply

    assert roundtrip(envelope(status_request=pb.StatusRequest())).kind == "status_request"
    status = {
        "env_steps": 900,
        "updates": 450,
        "policy_version": 7,
        "buffer": 880,
        "time": 12.5,
        "robots": {
            "arm-0": {
                "health": "ok",
                "acting_version": 6,
                "policy_lag": 1,
                "steps_per_second": 49.5,
                "backlog_bytes": 4096,
                "backlog_batches": 2,
                "last_error": None,
                "transitions": 440,
                "seconds_since_seen": 0.25,
                "quarantined_batches": 1,
                "rearmed": "by op:alice at 2026-11-26 21:03:11 (cleared the cli stop: gripper jam)",
            },
            "arm-1": {
                "health": "unhealthy: motor 2 hot",
                "acting_version": None,
                "policy_lag": None,
                "steps_per_second": 0.0,
                "backlog_bytes": 0,
                "backlog_batches": 0,
                "last_error": "robot: motor 2 hot",
                "transitions": 440,
                "seconds_since_seen": 3.0,
                "quarantined_batches": 0,
                "rearmed": None,
            },
        },
    }
    msg = roundtrip(envelope(status_reply=status_reply(status)))
    assert msg.kind == "status_reply" and status_from_reply(msg.body) == status


def test_envelope_needs_exactly_one_body() -> None:
    with pytest.raises(ValueError):
        envelope("r")
    with pytest.raises(ValueError):
        envelope("r", ack=pb.Ack(), reject=pb.Reject())


# -- rejections ------------------------------------------------------------------------------


def good_frames() -> list[bytes]:
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, 2, 3], np.int64)}
    return [bytes(f) for f in encode(envelope("r", batch=pb.TransitionBatch(seq=1, count=2)), arrays)]


def raw_envelope(**fields) -> pb.Envelope:
    env = pb.Envelope(protocol_version=PROTOCOL_VERSION, robot_id="r")
    env.batch.seq = 1
    for key, value in fields.items():
        setattr(env, key, value)
    return env


def reason(frames) -> str:
    with pytest.raises(WireError) as info:
        decode(frames)
    assert isinstance(info.value, ValueError)
    return info.value.reason


def test_good_frames_decode() -> None:
    msg = decode(good_frames())
    assert set(msg.arrays) == {"a", "b"}


def test_garbage_is_undecodable() -> None:
    assert reason([b"\xff\xff\xff\xff garbage \x00\x01"]) == "undecodable"
    assert reason([b"\x0a\x05ab"]) == "undecodable"  # length runs past the end


def test_empty_message() -> None:
    assert reason([]) == "empty"


def test_wrong_protocol_version() -> None:
    env = raw_envelope(protocol_version=PROTOCOL_VERSION + 1)
    assert reason([env.SerializeToString()]) == "wrong_version"
    # An empty envelope (version 0) is not silently accepted either.
    assert reason([b""]) == "wrong_version"


def test_no_body() -> None:
    env = pb.Envelope(protocol_version=PROTOCOL_VERSION, robot_id="r")
    assert reason([env.SerializeToString()]) == "no_body"


def test_missing_frame_is_frame_count() -> None:
    frames = good_frames()
    assert reason(frames[:-1]) == "frame_count"
    assert reason(frames + [b"extra"]) == "frame_count"


def test_truncated_frame_is_frame_size() -> None:
    frames = good_frames()
    frames[1] = frames[1][:-1]
    assert reason(frames) == "frame_size"
    frames = good_frames()
    frames[2] = frames[2] + b"\x00"
    assert reason(frames) == "frame_size"


def test_disallowed_dtype() -> None:
    env = raw_envelope()
    env.arrays.add(name="x", dtype="object", shape=[1])
    assert reason([env.SerializeToString(), b"\x00" * 8]) == "bad_dtype"
    env = raw_envelope()
    env.arrays.add(name="x", dtype="<U4", shape=[1])
    assert reason([env.SerializeToString(), b"\x00" * 16]) == "bad_dtype"
    # Encoding refuses such arrays too, before anything is sent.
    with pytest.raises(WireError) as info:
        encode(envelope("r", batch=pb.TransitionBatch()), {"x": np.array([object()], dtype=object)})
    assert info.value.reason == "bad_dtype"


def test_an_array_in_the_other_byte_order_arrives_with_its_values() -> None:
    # The frames carry one byte order (the dtype name says none): a big-endian array is converted,
    # never sent as its raw bytes under the same name.
    values = np.array([1.5, -2.0, 3.25], dtype=">f4")
    got = roundtrip(envelope("r", batch=pb.TransitionBatch()), {"x": values})
    assert got.envelope.arrays[0].dtype == "float32"
    assert got.arrays["x"].tolist() == [1.5, -2.0, 3.25]


def test_repeated_or_empty_array_name() -> None:
    env = raw_envelope()
    env.arrays.add(name="x", dtype="uint8", shape=[2])
    env.arrays.add(name="x", dtype="uint8", shape=[2])
    assert reason([env.SerializeToString(), b"ab", b"cd"]) == "bad_name"
    env = raw_envelope()
    env.arrays.add(name="", dtype="uint8", shape=[2])
    assert reason([env.SerializeToString(), b"ab"]) == "bad_name"


def test_bad_shape() -> None:
    env = raw_envelope()
    env.arrays.add(name="x", dtype="uint8", shape=[-1])
    assert reason([env.SerializeToString(), b""]) == "bad_shape"
    env = raw_envelope()
    env.arrays.add(name="x", dtype="uint8", shape=[1] * 9)
    assert reason([env.SerializeToString(), b"a"]) == "bad_shape"


def test_huge_declared_shape_is_frame_size_not_a_crash() -> None:
    env = raw_envelope()
    env.arrays.add(name="x", dtype="float64", shape=[2**40, 2**40])
    assert reason([env.SerializeToString(), b"\x00" * 8]) == "frame_size"


# -- transition batches (validate_batch) -----------------------------------------------------

SMALL_OBS = gym.spaces.Dict(
    {
        "image": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
        "state": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
    }
)
SMALL_ACTION = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def built_batch(rows: int = 6, end_at: dict[int, str] | None = None) -> tuple[int, dict[str, np.ndarray]]:
    """A batch the real edge builder makes; `end_at` maps row -> 'terminated' / 'truncated'."""
    end_at = end_at or {}
    builder = BatchBuilder(SMALL_OBS, SMALL_ACTION, capacity=16)
    episode, step = 0, 0
    for row in range(rows):
        obs = {"image": np.full((4, 4, 3), row, np.uint8), "state": np.array([row / 10, -row / 10], np.float32)}
        ends = end_at.get(row)
        builder.add(
            obs,
            np.array([0.1 * row, -0.1], np.float32),
            float(row),
            ends == "terminated",
            ends == "truncated",
            episode=episode,
            step=step,
            policy_version=1,
            actor=pb.ACTOR_POLICY,
            label=pb.LABEL_NONE,
            sensor_time=float(row),
            final_obs={"image": np.full((4, 4, 3), 200, np.uint8), "state": np.zeros(2, np.float32)} if ends else None,
        )
        step += 1
        if ends:
            episode, step = episode + 1, 0
    return builder.take()


def validation_reason(count: int, arrays: dict[str, np.ndarray]) -> str:
    with pytest.raises(WireError) as info:
        validate_batch(arrays, count, SMALL_OBS, SMALL_ACTION)
    return info.value.reason


def test_valid_batches_pass() -> None:
    count, arrays = built_batch()
    validate_batch(arrays, count, SMALL_OBS, SMALL_ACTION)
    count, arrays = built_batch(end_at={1: "terminated", 4: "truncated"})
    validate_batch(arrays, count, SMALL_OBS, SMALL_ACTION)
    # ... also after crossing the wire.
    frames = encode(envelope("r", batch=pb.TransitionBatch(seq=1, count=count)), arrays)
    validate_batch(decode([bytes(f) for f in frames]).arrays, count, SMALL_OBS, SMALL_ACTION)


def test_wrong_obs_shape() -> None:
    count, arrays = built_batch()
    arrays["obs/state"] = np.zeros((count, 3), np.float32)
    assert validation_reason(count, arrays) == "bad_shape"
    count, arrays = built_batch()
    arrays["obs/image"] = arrays["obs/image"][:, :, :3]
    assert validation_reason(count, arrays) == "bad_shape"


def test_wrong_dtype() -> None:
    count, arrays = built_batch()
    arrays["obs/image"] = arrays["obs/image"].astype(np.float32)  # images must stay uint8
    assert validation_reason(count, arrays) == "bad_dtype"
    count, arrays = built_batch()
    arrays["action"] = arrays["action"].astype(np.float64)
    assert validation_reason(count, arrays) == "bad_dtype"


def test_rows_must_match_count() -> None:
    count, arrays = built_batch()
    assert validation_reason(count + 1, arrays) == "bad_shape"
    assert validation_reason(0, arrays) == "bad_count"


def test_nan_action_and_reward() -> None:
    count, arrays = built_batch()
    arrays["action"][2, 1] = np.nan
    assert validation_reason(count, arrays) == "non_finite"
    count, arrays = built_batch()
    arrays["reward"][0] = np.inf
    assert validation_reason(count, arrays) == "non_finite"
    count, arrays = built_batch()
    arrays["reward"][3] = np.nan
    assert validation_reason(count, arrays) == "non_finite"
    count, arrays = built_batch()
    arrays["obs/state"][1, 0] = np.nan
    assert validation_reason(count, arrays) == "non_finite"
    # A final observation becomes a next observation in training: NaN there is refused too (the
    # fuzz test stored one before this check existed).
    count, arrays = built_batch(end_at={2: "terminated"})
    arrays["final_obs/state"][0, 1] = np.inf
    assert validation_reason(count, arrays) == "non_finite"


def test_missing_column() -> None:
    for column in ("reward", "action", "obs/image", "episode", "step"):
        count, arrays = built_batch()
        del arrays[column]
        assert validation_reason(count, arrays) == "missing_column", column
    count, arrays = built_batch(end_at={2: "terminated"})
    del arrays["final_obs/state"]
    assert validation_reason(count, arrays) == "missing_column"


def test_final_rows_must_match_episode_ends() -> None:
    count, arrays = built_batch(end_at={2: "terminated"})
    arrays["final_row"] = np.array([3], np.int64)
    assert validation_reason(count, arrays) == "bad_final_rows"
    # An episode end without its final row / observation.
    count, arrays = built_batch()
    arrays["truncated"][4] = True
    assert validation_reason(count, arrays) in {"bad_shape", "bad_final_rows"}
    # A final row listed although nothing ended there.
    count, arrays = built_batch(end_at={2: "terminated"})
    arrays["terminated"][2] = False
    assert validation_reason(count, arrays) in {"bad_shape", "bad_final_rows"}


def test_unknown_column() -> None:
    count, arrays = built_batch()
    arrays["obs/extra"] = np.zeros((count, 2), np.float32)
    assert validation_reason(count, arrays) == "unknown_column"
    count, arrays = built_batch()
    arrays["bonus"] = np.zeros(count, np.float32)
    assert validation_reason(count, arrays) == "unknown_column"
