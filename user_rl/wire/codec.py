"""Framing: one protobuf envelope, then one raw frame per array (dtype and shape in the envelope).

Nothing here is pickled. Decoding checks everything a hostile or broken peer could get
wrong and raises `WireError` with a short, loggable reason instead of crashing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from user_rl.wire import user_rl_pb2 as pb

PROTOCOL_VERSION = 1

# dtypes allowed on the wire; anything else is rejected before a buffer is interpreted.
WIRE_DTYPES = frozenset(
    {"bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16", "float32", "float64"}
)
MAX_ARRAYS_PER_MESSAGE = 4096
MAX_DIMS = 8
# Each wire dtype by its name and back, looked up once: `np.dtype.name` and `np.dtype(name)` cost
# microseconds each in numpy, and a batch has two dozen arrays on each side of the link.
_DTYPES: dict[str, np.dtype] = {name: np.dtype(name) for name in WIRE_DTYPES}
_NAMES: dict[np.dtype, str] = {dtype: name for name, dtype in _DTYPES.items()}


class WireError(ValueError):
    """A message that cannot be used. `reason` is a short stable key for counters."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass
class Message:
    """A decoded message: the envelope plus its arrays by name (zero-copy views when possible)."""

    envelope: pb.Envelope
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.envelope.WhichOneof("body") or ""

    @property
    def body(self):
        return getattr(self.envelope, self.kind)


def envelope(robot_id: str = "", **body: object) -> pb.Envelope:
    """Build an envelope with exactly one body, e.g. `envelope("arm-0", ack=pb.Ack(seq=3))`."""
    if len(body) != 1:
        raise ValueError("an envelope carries exactly one body")
    env = pb.Envelope(protocol_version=PROTOCOL_VERSION, robot_id=robot_id)
    ((name, value),) = body.items()
    getattr(env, name).CopyFrom(value)
    return env


def message_fields(message: ProtoMessage) -> dict[str, Any]:
    """A message's fields by their .proto names, defaults included (maps as dicts): one spelling, the
    schema's, from the sender to whatever reports the message."""
    out: dict[str, Any] = {}
    for field_ in message.DESCRIPTOR.fields:
        value = getattr(message, field_.name)
        if field_.message_type is not None and field_.message_type.GetOptions().map_entry:
            value = dict(value)
        out[field_.name] = value
    return out


def encode(env: pb.Envelope, arrays: Mapping[str, np.ndarray] | None = None) -> list[bytes | memoryview]:
    """Frames for `socket.send_multipart(frames, copy=False)`: the envelope, then each array."""
    frames: list[bytes | memoryview] = []
    del env.arrays[:]
    for name, array in (arrays or {}).items():
        array = np.asarray(array, order="C")  # keeps 0-d shape, unlike ascontiguousarray
        dtype = _NAMES.get(array.dtype)
        if dtype is None and array.dtype.byteorder not in "=|" and _NAMES.get(array.dtype.newbyteorder("=")):
            array = array.astype(array.dtype.newbyteorder("="))  # frames carry the native order (little-endian)
            dtype = _NAMES[array.dtype]
        if dtype is None:
            raise WireError("bad_dtype", f"{name}: {array.dtype} cannot go on the wire")
        env.arrays.add(name=name, dtype=dtype, shape=array.shape)
        frames.append(memoryview(array).cast("B") if array.size else b"")
    return [env.SerializeToString(), *frames]


def decode(frames: Sequence[bytes | memoryview | object]) -> Message:
    """Parse and validate one message; raise `WireError` naming what was wrong."""
    if not frames:
        raise WireError("empty", "no frames")
    raw = [f.buffer if hasattr(f, "buffer") else f for f in frames]
    env = pb.Envelope()
    try:
        env.ParseFromString(bytes(raw[0]))
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise WireError("undecodable", str(exc)[:200]) from None
    if env.protocol_version != PROTOCOL_VERSION:
        raise WireError("wrong_version", f"peer speaks protocol {env.protocol_version}, this side {PROTOCOL_VERSION}")
    if env.WhichOneof("body") is None:
        raise WireError("no_body", "envelope carries no message")
    specs = env.arrays
    if len(specs) > MAX_ARRAYS_PER_MESSAGE:
        raise WireError("too_many_arrays", f"{len(specs)} arrays")
    if len(specs) != len(raw) - 1:
        raise WireError("frame_count", f"envelope lists {len(specs)} arrays but {len(raw) - 1} frames follow")
    arrays: dict[str, np.ndarray] = {}
    for spec, frame in zip(specs, raw[1:]):
        if not spec.name or spec.name in arrays:
            raise WireError("bad_name", f"array name {spec.name!r} is empty or repeated")
        arrays[spec.name] = _array(spec, frame)
    return Message(env, arrays)


def _array(spec: pb.ArraySpec, frame: object) -> np.ndarray:
    dtype = _DTYPES.get(spec.dtype)
    if dtype is None:
        raise WireError("bad_dtype", f"{spec.name}: dtype {spec.dtype!r} not allowed")
    shape = tuple(spec.shape)
    if len(shape) > MAX_DIMS or min(shape, default=0) < 0:
        raise WireError("bad_shape", f"{spec.name}: shape {list(shape)}")
    # Python ints: exact, and no overflow for a hostile shape (np.prod on int64 could wrap).
    expected = math.prod(shape) * dtype.itemsize
    view = memoryview(frame)
    if view.nbytes != expected:
        raise WireError(
            "frame_size", f"{spec.name}: {view.nbytes} bytes for {spec.dtype}{list(shape)} ({expected} expected)"
        )
    return np.frombuffer(view, dtype=dtype).reshape(shape)
