"""Runs any actor one action per control step, inferring a chunk only when the last one is used up.

A chunk policy (`act_chunk` → (B, H, A)) is asked once every H steps; an actor without chunks
(the MLP's `act` → (B, A)) is a chunk policy with H = 1. Each action comes with its index in its
chunk (`chunk_step`, 0 for the first), which the edge records, so the learner knows which
actions of a chunk were executed. `restart()` drops the rest of a chunk: at a new episode, and
when someone else drove (the chunk was planned for a state the robot has left).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from user_rl.policies.weights import load_received


def chunk_length(actor: nn.Module) -> int:
    return int(getattr(actor, "chunk_length", 1))


def act_chunk(actor: nn.Module, obs: dict[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
    """(B, H, A) actions in the robot's units from any actor (H = 1 for one without chunks)."""
    if hasattr(actor, "act_chunk"):
        return actor.act_chunk(obs, deterministic=deterministic)
    return actor.act(obs, deterministic=deterministic).unsqueeze(1)


def infer_chunk(
    actor: nn.Module, obs: dict[str, np.ndarray], deterministic: bool = False, device: torch.device | str = "cpu"
) -> np.ndarray:
    """One observation in, its (H, A) chunk out as float32 numpy: what an edge runs per chunk."""
    batch = {k: torch.as_tensor(v).unsqueeze(0).to(device) for k, v in obs.items()}
    return act_chunk(actor, batch, deterministic)[0].float().cpu().numpy()


class ChunkRunner:
    def __init__(self, actor: nn.Module, deterministic: bool = False) -> None:
        self.actor = actor
        self.deterministic = deterministic
        self._chunk: np.ndarray | None = None
        self._next = 0
        self.inferences = 0
        self._loaded = -1  # the version of the weights loaded
        self.version = -1  # the version of the weights that planned the chunk in hand

    def restart(self) -> None:
        """The next action starts a new chunk."""
        self._chunk = None

    def swap(self, state: dict[str, torch.Tensor], version: int = -1) -> None:
        """New weights (policy `version`), for the next chunk (the one in hand runs to its end)."""
        load_received(self.actor, state)
        self._loaded = version

    @torch.no_grad()
    def __call__(self, obs: dict[str, np.ndarray]) -> tuple[np.ndarray, int]:
        """The action for this step and its index in its chunk."""
        if self._chunk is None or self._next >= len(self._chunk):
            self._chunk = infer_chunk(self.actor, obs, self.deterministic)
            self._next = 0
            self.inferences += 1
            self.version = self._loaded
        index = self._next
        self._next += 1
        return self._chunk[index], index
