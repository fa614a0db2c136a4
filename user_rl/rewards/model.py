"""The success classifier's network and its file: observation keys in, P(success) out.

Cameras go through the policies' own `ConvEncoder` (via `DictEncoder`); vectors are standardised
with the mean and spread of the frames it was trained on (kept in the file), so a success that
hinges on a few centimetres in a state vector is not lost in its scale.

The file holds weights and plain metadata only (keys, their shapes and dtypes, hidden sizes), so
it loads with `torch.load(weights_only=True)`: no pickled code runs on the robot.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from user_rl.policies.encoders import DictEncoder, is_image, mlp, module_key

FILE_FORMAT = "user-rl success classifier"
FILE_VERSION = 1


class ClassifierFileError(ValueError):
    """A classifier file that cannot be used: missing, not a classifier, or made for other observations."""


def observation_subspace(space: gym.spaces.Dict, keys: list[str]) -> gym.spaces.Dict:
    """The part of a robot's observation space the classifier reads; a clear error for a missing key."""
    missing = [k for k in keys if k not in space.spaces]
    if missing:
        raise ValueError(
            f"reward.keys: the robot has no observation {missing[0]!r}; it has: {', '.join(sorted(space.spaces))}"
        )
    if not keys:
        raise ValueError("reward.keys: name at least one observation key for the classifier to read")
    return gym.spaces.Dict({k: space[k] for k in keys})


class SuccessClassifier(nn.Module):
    """Logit of "this observation shows the task done"."""

    def __init__(self, space: gym.spaces.Dict, hidden: list[int] | None = None) -> None:
        super().__init__()
        self.space = space
        self.keys = sorted(space.spaces)
        self.hidden = list(hidden or [64])
        self.encoder = DictEncoder(space)
        self.head = mlp(self.encoder.out_dim, self.hidden, 1)
        for k in self.vector_keys:  # set from the training frames by `fit_normaliser`
            shape = space[k].shape
            self.register_buffer(f"mean_{module_key(k)}", torch.zeros(shape))
            self.register_buffer(f"std_{module_key(k)}", torch.ones(shape))

    @property
    def vector_keys(self) -> list[str]:
        return [k for k in self.keys if not is_image(self.space[k])]

    def fit_normaliser(self, frames: dict[str, np.ndarray]) -> None:
        for k in self.vector_keys:
            values = torch.as_tensor(frames[k], dtype=torch.float32)
            getattr(self, f"mean_{module_key(k)}").copy_(values.mean(0))
            getattr(self, f"std_{module_key(k)}").copy_(values.std(0).clamp_min(1e-6))

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        obs = dict(obs)
        for k in self.vector_keys:
            obs[k] = (obs[k].float() - getattr(self, f"mean_{module_key(k)}")) / getattr(self, f"std_{module_key(k)}")
        return self.head(self.encoder(obs)).squeeze(-1)

    @torch.no_grad()
    def probability(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """P(success) for a batch of observations (arrays with a leading batch axis)."""
        return torch.sigmoid(self({k: torch.as_tensor(obs[k]) for k in self.keys})).numpy()


def save_classifier(model: SuccessClassifier, path: str | Path, metrics: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "format": FILE_FORMAT,
            "version": FILE_VERSION,
            "keys": model.keys,
            "spaces": {
                k: {"shape": list(model.space[k].shape), "dtype": str(model.space[k].dtype)} for k in model.keys
            },
            "hidden": model.hidden,
            "metrics": {k: float(v) for k, v in (metrics or {}).items()},
            "state_dict": model.state_dict(),
        },
        path,
    )
    return path


def load_classifier(path: str | Path) -> SuccessClassifier:
    """A saved classifier, ready to judge (eval mode)."""
    path = Path(path)
    if not path.is_file():
        raise ClassifierFileError(
            f"reward.classifier: no classifier file at {path} (make one with `user-rl reward train RUN_DIR --out FILE`)"
        )
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ClassifierFileError(f"reward.classifier: {path} is not a classifier file ({exc})") from None
    if not isinstance(saved, dict) or saved.get("format") != FILE_FORMAT:
        raise ClassifierFileError(f"reward.classifier: {path} is not a {FILE_FORMAT} file")
    space = gym.spaces.Dict({k: box_space(spec["shape"], spec["dtype"]) for k, spec in saved["spaces"].items()})
    model = SuccessClassifier(space, saved["hidden"])
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def check_fits(model: SuccessClassifier, space: gym.spaces.Dict, path: str | Path) -> None:
    """The robot's observations must be what the classifier was trained on (same keys, shapes, dtypes)."""
    for k in model.keys:
        if k not in space.spaces:
            raise ClassifierFileError(
                f"reward.classifier: {path} reads observation {k!r}, which this robot "
                f"does not have (it has: {', '.join(sorted(space.spaces))})"
            )
        want, have = model.space[k], space[k]
        if tuple(want.shape) != tuple(have.shape) or want.dtype != have.dtype:
            raise ClassifierFileError(
                f"reward.classifier: {path} was trained on {k!r} of shape {tuple(want.shape)} "
                f"{want.dtype}; this robot's is {tuple(have.shape)} {have.dtype}"
            )


def box_space(shape: list[int], dtype: str) -> gym.spaces.Box:
    """The space of one observation key from its shape and dtype (uint8: an image, 0..255)."""
    dtype = np.dtype(dtype)
    if dtype == np.uint8:
        return gym.spaces.Box(0, 255, tuple(shape), dtype)
    return gym.spaces.Box(-np.inf, np.inf, tuple(shape), dtype)
