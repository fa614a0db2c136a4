"""Checkpoints: the learner's full state, and everything `user-rl eval` needs to rebuild the actor.

Written to a temporary file and renamed into place, so a crash never leaves half a checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.spaces import box_from_proto, box_to_proto, dict_space_from_proto, dict_space_to_proto


def spaces_to_text(obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> dict[str, str]:
    hello = pb.Hello(observation_space=dict_space_to_proto(obs_space), action_space=box_to_proto(action_space))
    return {"hello_hex": hello.SerializeToString().hex()}


def spaces_from_text(text: dict[str, str]) -> tuple[gym.spaces.Dict, gym.spaces.Box]:
    hello = pb.Hello.FromString(bytes.fromhex(text["hello_hex"]))
    return dict_space_from_proto(hello.observation_space), box_from_proto(hello.action_space)


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return torch.load(path, map_location="cpu", weights_only=True)
