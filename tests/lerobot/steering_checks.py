"""What the LeRobot venv's check scripts ask of a frozen LeRobot base under dsrl and residual
(policy_checks.py: diffusion with DDIM; smolvla_checks.py: SmolVLA), in one place."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

import torch

from user_rl.algos import DSRLSettings, ResidualSettings

SMALL = {"steer_hidden": [32], "critic_hidden": [32]}
SETTINGS = {
    "dsrl": DSRLSettings(**SMALL),
    "dsrl_shared": DSRLSettings(shared_noise=True, **SMALL),  # one row of noise, repeated over the chunk
    "residual": ResidualSettings(**SMALL),
}


def digest(module: torch.nn.Module) -> str:
    return hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in module.state_dict().values())).hexdigest()


def steered(make: Callable, obs: dict[str, torch.Tensor], batch: dict) -> dict:
    """Each of SETTINGS' algorithms built by `make(settings)`, three updates on `batch`, then its small
    actor moved: the latent's size, the executed chunk's shape, whether the chunk followed the small
    actor while the base's weights stayed as they were; and whether the same noise gives the base the same chunk."""
    found = {}
    for name, settings in SETTINGS.items():
        steering = make(settings)
        base_hash = digest(steering.pretrained)
        before = steering.actor.act_chunk(obs, deterministic=True)
        for _ in range(3):
            steering.update(batch)
        with torch.no_grad():
            steering.actor.steer.trunk[-1].bias.add_(0.5)
        after = steering.actor.act_chunk(obs, deterministic=True)
        found[f"{name}_latent"] = steering.actor.latent_dim
        found[f"{name}_chunk_shape"] = list(after.shape)
        found[f"{name}_base_unchanged"] = digest(steering.pretrained) == base_hash
        found[f"{name}_chunk_follows_the_small_actor"] = not torch.allclose(before, after)
    base = steering.pretrained
    noise = torch.randn(len(next(iter(obs.values()))), math.prod(base.noise_shape))
    with torch.no_grad():
        found["noise_names_the_chunk"] = bool(
            torch.equal(base.chunk_from_noise(obs, noise), base.chunk_from_noise(obs, noise))
        )
    return found
