"""Wire messages as an edge sends them, for tests that speak to an ingest or a learner directly."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

from user_rl.edge.batching import BatchBuilder
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import encode, envelope
from user_rl.wire.spaces import box_to_proto, dict_space_to_proto


def hello_envelope(
    robot_id: str, epoch: int, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, model: str = "test"
) -> pb.Envelope:
    """A simulated robot's hello for stream `epoch`."""
    hello = pb.Hello(
        descriptor=pb.Descriptor(kind="sim", model=model, id=robot_id),
        observation_space=dict_space_to_proto(obs_space),
        action_space=box_to_proto(action_space),
        stream_epoch=epoch,
    )
    return envelope(robot_id, hello=hello)


def hello_frames(
    robot_id: str, epoch: int, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, model: str = "test"
) -> list[bytes]:
    """That hello's frames, as bytes."""
    return [bytes(f) for f in encode(hello_envelope(robot_id, epoch, obs_space, action_space, model))]


def first_steps(
    obs_space: gym.spaces.Dict,
    action_space: gym.spaces.Box,
    rows: int,
    obs: Callable[[int], dict[str, np.ndarray]],
    action: Callable[[int], np.ndarray],
    actor: int = pb.ACTOR_POLICY,
) -> tuple[int, dict[str, np.ndarray]]:
    """A batch (count, columns) of episode 0's first `rows` steps by `actor`, with no reward, no end
    and no policy version yet: `obs(step)` and `action(step)` give each step's observation and action."""
    builder = BatchBuilder(obs_space, action_space, capacity=rows)
    for step in range(rows):
        builder.add(
            obs(step),
            action(step),
            0.0,
            False,
            False,
            episode=0,
            step=step,
            policy_version=-1,
            actor=actor,
            label=pb.LABEL_NONE,
            sensor_time=0.0,
        )
    return builder.take()
