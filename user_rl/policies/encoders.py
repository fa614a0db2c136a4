"""Observation encoders: dict of arrays in, one feature vector out.

Images arrive as uint8 HWC and become float on the network's device, never before.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn


def is_image(space: gym.spaces.Box) -> bool:
    return space.dtype == np.uint8 and len(space.shape) == 3


def module_key(key: str) -> str:
    """An observation key as the name of a submodule, parameter or buffer, which torch forbids to hold
    dots: a nested observation's key does (`pixels.front`, user_rl/sim/gym_adapter.py), so it is named
    `pixels:front` there. A key without dots keeps its name (and checkpoints theirs)."""
    return key.replace(".", ":")


def unit_pixels(image: torch.Tensor) -> torch.Tensor:
    """uint8 (B, H, W, C) camera frames as float (B, C, H, W) in [0, 1], as every image encoder reads them."""
    return image.permute(0, 3, 1, 2).float() / 255.0


class ConvEncoder(nn.Module):
    """A small DrQ-style conv stack for one camera (HWC uint8 → features)."""

    def __init__(self, shape: tuple[int, ...], channels: int = 32, features: int = 64) -> None:
        super().__init__()
        h, w, c = shape
        self.net = nn.Sequential(
            nn.Conv2d(c, channels, 3, stride=2),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.net(torch.zeros(1, c, h, w)).shape[1]
        self.head = nn.Sequential(nn.Linear(flat, features), nn.LayerNorm(features), nn.Tanh())
        self.out_dim = features

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(unit_pixels(image)))


class DictEncoder(nn.Module):
    """Concatenates flattened vectors with the features of each camera, in sorted key order.

    A uint8 vector that is not an image (an instruction's bytes) is scaled to [0, 1], as pixels
    are: raw byte values up to 255 beside states near 1 would swamp the first layer."""

    def __init__(self, space: gym.spaces.Dict) -> None:
        super().__init__()
        self.keys = sorted(space.spaces)
        self.camera_keys = [k for k in self.keys if is_image(space[k])]
        self.cameras = nn.ModuleDict({module_key(k): ConvEncoder(space[k].shape) for k in self.camera_keys})
        self.byte_keys = {k for k in self.keys if k not in self.camera_keys and space[k].dtype == np.uint8}
        self.out_dim = sum(
            self.camera(k).out_dim if k in self.camera_keys else int(np.prod(space[k].shape)) for k in self.keys
        )

    def camera(self, key: str) -> ConvEncoder:
        return self.cameras[module_key(key)]

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [self.camera(k)(obs[k]) if k in self.camera_keys else self.vector(k, obs[k]) for k in self.keys]
        return torch.cat(parts, dim=-1)

    def vector(self, key: str, value: torch.Tensor) -> torch.Tensor:
        flat = value.flatten(1).float()
        return flat / 255.0 if key in self.byte_keys else flat


class ActionScaling(nn.Module):
    """An actor's map between the robot's action units and [-1, 1] (buffers, so they travel with
    the weights): networks work in [-1, 1], edges execute robot units."""

    def __init__(self, action_space: gym.spaces.Box) -> None:
        super().__init__()
        low = torch.as_tensor(action_space.low, dtype=torch.float32)
        high = torch.as_tensor(action_space.high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def normalize(self, action: torch.Tensor) -> torch.Tensor:
        return ((action - self.action_bias) / self.action_scale).clamp(-1.0, 1.0)

    def to_robot_units(self, normalised: torch.Tensor) -> torch.Tensor:
        return normalised * self.action_scale + self.action_bias


def mlp(in_dim: int, hidden: list[int], out_dim: int, layer_norm: bool = False) -> nn.Sequential:
    """Linear layers with ReLU between them; `layer_norm` puts a LayerNorm before each ReLU."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), *([nn.LayerNorm(width)] if layer_norm else []), nn.ReLU()]
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)
