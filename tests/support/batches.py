"""Batches as the buffer's `sample` gives them (every actor kind, chunk columns included), drawn
at random from any robot's spaces, and turned into what the trainer hands an algorithm."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from user_rl.algos.graphed import training_batch
from user_rl.cloud.batches import training_columns
from user_rl.wire import user_rl_pb2 as pb

ACTORS = np.array([pb.ACTOR_POLICY, pb.ACTOR_HUMAN, pb.ACTOR_SCRIPTED], np.uint8)
CHUNK_ACTORS = np.array([pb.ACTOR_POLICY, pb.ACTOR_SCRIPTED, pb.ACTOR_WARMUP], np.uint8)


def random_obs(obs_space: gym.spaces.Dict, size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """`size` observations of each key, uniform within the space (finite bounds where it has none)."""
    out = {}
    for key, space in obs_space.spaces.items():
        if space.dtype == np.uint8:
            out[key] = rng.integers(0, 256, (size, *space.shape), dtype=np.uint8)
        else:
            low = np.clip(np.broadcast_to(space.low, space.shape), -1, 1)
            high = np.clip(np.broadcast_to(space.high, space.shape), -1, 1)
            out[key] = rng.uniform(low, high, (size, *space.shape)).astype(space.dtype)
    return out


def buffer_batch(
    obs_space: gym.spaces.Dict,
    action_space: gym.spaces.Box,
    rng: np.random.Generator,
    size: int = 16,
    chunk: int = 2,
    gamma: float = 0.99,
) -> dict[str, np.ndarray]:
    """A sampled batch: obs and next obs, actions in the action space, chunks of `chunk` actions."""
    low, high = action_space.low, action_space.high
    return {
        **{f"obs/{k}": v for k, v in random_obs(obs_space, size, rng).items()},
        **{f"next_obs/{k}": v for k, v in random_obs(obs_space, size, rng).items()},
        "action": rng.uniform(low, high, (size, *action_space.shape)).astype(action_space.dtype),
        "reward": rng.normal(size=size).astype(np.float32),
        "terminated": rng.random(size) < 0.1,
        "policy_version": np.ones(size, np.int64),
        "robot": np.zeros(size, np.int64),
        "actor": np.resize(ACTORS, size),
        "discount": np.full(size, gamma**chunk, np.float32),
        "action_chunk": rng.uniform(low, high, (size, chunk, *action_space.shape)).astype(action_space.dtype),
        "chunk_mask": np.arange(chunk)[None] < rng.integers(1, chunk + 1, (size, 1)),
        "chunk_actor": np.resize(CHUNK_ACTORS, (size, chunk)),
    }


def algorithm_batch(batch: dict[str, np.ndarray], batch_columns: tuple[str, ...]) -> dict:
    """What the trainer process hands an algorithm with these `batch_columns`: its columns, as tensors."""
    columns = training_columns(batch, batch_columns)
    return training_batch({k: torch.from_numpy(v) for k, v in columns.items()}, torch.device("cpu"))
