"""Spaces and descriptors on the wire: what an edge tells the learner in its hello."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.wire import user_rl_pb2 as pb


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
    shape = tuple(int(d) for d in msg.shape)
    low = np.asarray(msg.low, np.float64)
    high = np.asarray(msg.high, np.float64)
    if low.size == 1:
        low, high = np.full(shape, low[0]), np.full(shape, high[0])
    dtype = np.dtype(msg.dtype)
    return gym.spaces.Box(low.reshape(shape).astype(dtype), high.reshape(shape).astype(dtype), shape, dtype)


def dict_space_to_proto(space: gym.spaces.Dict) -> dict[str, pb.BoxSpace]:
    return {key: box_to_proto(sub) for key, sub in space.spaces.items()}


def dict_space_from_proto(entries) -> gym.spaces.Dict:
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
