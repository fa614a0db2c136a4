"""Image augmentation for learning from pixels, done on the learner's device on uint8 images."""

from __future__ import annotations

import torch


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """Each image of a (B, H, W, C) batch moved by up to `pad` pixels each way, its edge pixels
    repeated: DrQ's pad-and-random-crop (Kostrikov et al., 2020), as one gather, in any dtype."""
    if pad == 0:
        return images
    batch, height, width, _ = images.shape
    device = images.device
    shift = torch.randint(-pad, pad + 1, (batch, 2), device=device)
    rows = (torch.arange(height, device=device) + shift[:, :1]).clamp(0, height - 1)  # (B, H)
    cols = (torch.arange(width, device=device) + shift[:, 1:]).clamp(0, width - 1)  # (B, W)
    return images[torch.arange(batch, device=device)[:, None, None], rows[:, :, None], cols[:, None, :]]
