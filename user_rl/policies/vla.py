"""A vision-language-action policy: camera images + an instruction + proprioception → action chunks.

The backbone is a transformer over one sequence of tokens: image patches (a strided convolution
per camera, as in ViT), the instruction's bytes (UTF-8, one token each, so no tokenizer file is
needed and nothing is downloaded), and one token for the proprioceptive state; a learned readout
token gathers them. The flow head of `FlowChunkActor` turns the readout into chunks of H actions
(the π0 recipe, with an MLP action head). Sizes are named (`SIZES`: tiny for CI, ~100M and ~500M
parameters for benchmarks) or given as `dim`, `depth`, `heads`.

Observations: every uint8 HWC key is a camera; `instruction` is a uint8 vector of bytes (0 pads;
`user_rl.hal.instruction` writes it); every other key is proprioception. Pretrained weights load by name from a local safetensors file
(`policy.weights`), and `policy.freeze: [encoder]` trains only the action head.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from user_rl.policies.encoders import is_image
from user_rl.policies.flow import FlowChunkActor

INSTRUCTION = "instruction"  # the observation key (user_rl/hal/instruction.py; policies import nothing of ours)


@dataclass(frozen=True)
class VLASize:
    dim: int
    depth: int
    heads: int
    head_hidden: int  # width of the flow head's two hidden layers


SIZES = {
    "tiny": VLASize(dim=64, depth=2, heads=4, head_hidden=256),
    "100m": VLASize(dim=768, depth=14, heads=12, head_hidden=1024),
    "500m": VLASize(dim=1280, depth=25, heads=16, head_hidden=2048),
}


class VLAEncoder(nn.Module):
    """Patches, instruction bytes and the proprioceptive state in; the readout token's features out."""

    def __init__(self, obs_space: gym.spaces.Dict, dim: int, depth: int, heads: int, patch: int = 8) -> None:
        super().__init__()
        keys = sorted(obs_space.spaces)
        self.camera_keys = [k for k in keys if is_image(obs_space[k])]
        self.state_keys = [k for k in keys if k not in self.camera_keys and k != INSTRUCTION]
        self.has_instruction = INSTRUCTION in obs_space.spaces
        self.patch_embed = nn.ModuleDict()
        self.patch_pos = nn.ParameterDict()
        for key in self.camera_keys:
            h, w, c = obs_space[key].shape
            if h % patch or w % patch:
                raise ValueError(f"camera {key!r}: {h}x{w} pixels do not split into {patch}x{patch} patches")
            self.patch_embed[key] = nn.Conv2d(c, dim, patch, stride=patch)
            self.patch_pos[key] = nn.Parameter(torch.randn(1, (h // patch) * (w // patch), dim) * 0.02)
        if self.has_instruction:
            length = obs_space[INSTRUCTION].shape[0]
            self.byte_embed = nn.Embedding(256, dim, padding_idx=0)
            self.text_pos = nn.Parameter(torch.randn(1, length, dim) * 0.02)
        state_dim = sum(int(np.prod(obs_space[k].shape)) for k in self.state_keys)
        self.state_embed = nn.Linear(state_dim, dim) if state_dim else None
        self.readout = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.transformer = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.out_dim = dim

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = len(next(iter(obs.values())))
        device = self.readout.device

        def unpadded(n: int) -> torch.Tensor:
            return torch.zeros(batch, n, dtype=torch.bool, device=device)

        tokens, padding = [self.readout.expand(batch, -1, -1)], [unpadded(1)]
        for key in self.camera_keys:
            image = obs[key].permute(0, 3, 1, 2).float() / 255.0
            patches = self.patch_embed[key](image).flatten(2).transpose(1, 2) + self.patch_pos[key]
            tokens.append(patches)
            padding.append(unpadded(patches.shape[1]))
        if self.has_instruction:
            text = obs[INSTRUCTION].long()
            tokens.append(self.byte_embed(text) + self.text_pos)
            padding.append(text == 0)
        if self.state_embed is not None:
            state = torch.cat([obs[k].flatten(1).float() for k in self.state_keys], dim=-1)
            tokens.append(self.state_embed(state).unsqueeze(1))
            padding.append(unpadded(1))
        x = torch.cat(tokens, dim=1)
        return self.norm(self.transformer(x, src_key_padding_mask=torch.cat(padding, dim=1))[:, 0])


class VLAChunkActor(FlowChunkActor):
    def __init__(self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, hidden: list[int] | None = None,
                 chunk: int = 4, flow_steps: int = 10, best_of: int = 1, size: str = "tiny", patch: int = 8) -> None:
        """`size` names the backbone (`SIZES`); `hidden` overrides its flow head's widths."""
        if size not in SIZES:
            raise ValueError(f"unknown VLA size {size!r}; named sizes: {', '.join(SIZES)}")
        s = SIZES[size]
        encoder = VLAEncoder(obs_space, s.dim, s.depth, s.heads, patch)
        super().__init__(obs_space, action_space, hidden or [s.head_hidden] * 2, chunk, flow_steps, best_of, encoder)
