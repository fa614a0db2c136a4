"""Spaces and descriptors on the wire: what an edge tells the learner in its hello."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import MAX_DIMS, WIRE_DTYPES

MAX_SPACE_ELEMENTS = 1 << 24  # per observation entry or action (a 2048 x 2048 x 4 image)
MAX_OBSERVATION_KEYS = 64
MAX_NAME_CHARS = 128  # observation keys, robot ids
MAX_TEXT_CHARS = 4096  # instructions and other free text in a hello


def box_to_proto(space: gym.spaces.Box) -> pb.BoxSpace:
    low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
    uniform = low.size and np.all(low == low.flat[0]) and np.all(high == high.flat[0])
    return pb.BoxSpace(
        dtype=space.dtype.name,
        shape=space.shape,
        low=[low.flat[0]] if uniform else low.ravel().tolist(),
        high=[high.flat[0]] if uniform else high.ravel().tolist(),
    )


def box_from_proto(msg: pb.BoxSpace) -> gym.spaces.Box:
    """A peer's declared space, checked before anything the size of it is allocated (ValueError)."""
    shape = tuple(int(d) for d in msg.shape)
    if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
        raise ValueError(f"shape {list(shape)}: at most {MAX_DIMS} dimensions, none negative")
    elements = int(np.prod(shape, dtype=np.float64))
    if elements > MAX_SPACE_ELEMENTS:
        raise ValueError(f"shape {list(shape)} has {elements:,} elements (at most {MAX_SPACE_ELEMENTS:,})")
    if msg.dtype not in WIRE_DTYPES:
        raise ValueError(f"dtype {msg.dtype!r} is not allowed on the wire")
    if len(msg.low) != len(msg.high) or len(msg.low) not in (1, elements):
        raise ValueError(f"bounds: {len(msg.low)} low and {len(msg.high)} high values for {elements} elements")
    low = np.asarray(msg.low, np.float64)
    high = np.asarray(msg.high, np.float64)
    if np.isnan(low).any() or np.isnan(high).any() or (low > high).any():
        raise ValueError("bounds: NaN, or a low bound above its high bound")
    if low.size == 1:
        low, high = np.full(shape, low[0]), np.full(shape, high[0])
    dtype = np.dtype(msg.dtype)
    return gym.spaces.Box(low.reshape(shape).astype(dtype), high.reshape(shape).astype(dtype), shape, dtype)


def dict_space_to_proto(space: gym.spaces.Dict) -> dict[str, pb.BoxSpace]:
    return {key: box_to_proto(sub) for key, sub in space.spaces.items()}


def dict_space_from_proto(entries) -> gym.spaces.Dict:
    if not 0 < len(entries) <= MAX_OBSERVATION_KEYS:
        raise ValueError(f"{len(entries)} observation keys (1 to {MAX_OBSERVATION_KEYS})")
    for key in entries:
        if not key or len(key) > MAX_NAME_CHARS or not key.isprintable():
            raise ValueError(f"observation key {key[:MAX_NAME_CHARS]!r} is empty, too long or unprintable")
    return gym.spaces.Dict({key: box_from_proto(entries[key]) for key in sorted(entries)})


def descriptor_to_proto(d: DeviceDescriptor) -> pb.Descriptor:
    return pb.Descriptor(
        kind=d.kind, model=d.model, id=d.id, control_hz=d.control_hz,
        instruction=d.instruction, cameras=list(d.cameras),
    )


def descriptor_from_proto(msg: pb.Descriptor) -> DeviceDescriptor:
    return DeviceDescriptor(
        kind=msg.kind, model=msg.model, id=msg.id, control_hz=msg.control_hz,  # type: ignore[arg-type]
        instruction=msg.instruction, cameras=tuple(msg.cameras),
    )
