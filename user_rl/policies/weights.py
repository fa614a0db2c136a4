"""Initial weights for a policy from a local file: nothing is downloaded, ever.

A `.safetensors` file holds tensors by their names in the actor's `state_dict`; a `.pt` file is
a run's checkpoint (its "actor"). The file may cover only part of the actor (a pretrained
backbone, or a behaviour-cloned flow without the critic Q-chunking adds): the rest keeps its
fresh initialisation and is named in the result. A tensor the actor does not have, or of
another shape, is an error that names it, since it means the file is for another model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from user_rl.policies.ensemble import to_stacked_layout


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights file at {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    if path.suffix == ".pt":
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("actor"), dict):
            raise ValueError(f"{path} is not a run's checkpoint (no 'actor' in it)")
        return checkpoint["actor"]
    raise ValueError(f"{path}: weights are read from .safetensors files or a run's checkpoint.pt")


def save_weights(module: nn.Module, path: str | Path) -> None:
    """Write `module`'s state as safetensors (contiguous copies; shared tensors are written once each)."""
    from safetensors.torch import save_file

    save_file(
        {name: tensor.detach().cpu().contiguous().clone() for name, tensor in module.state_dict().items()}, str(path)
    )


def load_weights(actor: nn.Module, path: str | Path) -> list[str]:
    """Load what the file has into `actor`; returns the parameters it left at their initial values
    (buffers such as the action scaling come from the spaces, not from training)."""
    stored = to_stacked_layout(actor, read_weights(path))  # a critic in it may be an older, unstacked one
    own = actor.state_dict()
    unknown = sorted(set(stored) - set(own))
    if unknown:
        raise ValueError(
            f"{path} holds {unknown[0]!r}, which this policy does not have "
            f"({len(unknown)} such tensors): the file is for another model or configuration"
        )
    for name, tensor in stored.items():
        if tensor.shape != own[name].shape:
            raise ValueError(
                f"{path}: {name!r} has shape {list(tensor.shape)}, this policy's is {list(own[name].shape)}"
            )
    actor.load_state_dict(stored, strict=False)
    return sorted(name for name, _ in actor.named_parameters() if name not in stored)


def load_received(actor: nn.Module, state: dict[str, torch.Tensor]) -> bool:
    """Load a received policy version into `actor`; True when its tensors were taken as they are.

    A version arrives as views of the receiver's buffer. When every tensor already has the dtype,
    shape and device the actor's has (a bfloat16 VLA on a CPU edge), the actor takes those views
    (`assign`): a 1 GB model is applied without copying a byte, and the receiver reuses the buffer
    only once the actor has let go of it. Otherwise (a cast to float32, a copy to the GPU) it is
    loaded by copy, as `load_state_dict` always does."""
    own = actor.state_dict()
    fits = own.keys() == state.keys() and all(
        tensor.dtype == own[name].dtype and tensor.shape == own[name].shape and tensor.device == own[name].device
        for name, tensor in state.items()
    )
    actor.load_state_dict(state, assign=fits)
    return fits
