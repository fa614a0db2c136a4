"""The actor's weights, handed from the trainer process to the weight server in shared memory.

At a publish the update thread copies each tensor of the actor once, cast to `weight_dtype`,
into a free shared buffer; the learner serves the edges straight from it (chunks are views) and
hands it back when a newer version replaced it and every chunk left. No serialising, no pipe, no
second copy: the update thread pays one memcpy of the actor per publish.

Frozen parameters (a pretrained backbone) are written once into a base buffer of their own, named
by a hash of their bytes; edges keep it, so later versions carry only the trainable part.

When every buffer is still in use (a slow edge is draining an old version), a routine publish is
skipped: the next one carries newer weights anyway, and the update thread never waits on the
network. A publish that was asked for (pause, shutdown) waits for a buffer.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from user_rl.wire.weights import DEFAULT_CHUNK_BYTES, Layout, PackedWeights, Part, base_part_id, byte_view, own_part_id

BUFFERS = 3  # one the server sends from, one a slow edge may still drain, one to write the next into


class ActorBuffers:
    """Shared between the trainer (writes) and the learner (serves); crosses the process boundary once."""

    def __init__(
        self,
        actor: nn.Module,
        cast_floats_to: torch.dtype | None = None,
        count: int = BUFFERS,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        state = actor.state_dict()
        frozen = {name for name, p in actor.named_parameters() if not p.requires_grad and name in state}
        self.own_layout = Layout.of(((n, t) for n, t in state.items() if n not in frozen), cast_floats_to)
        self.base_layout = Layout.of(((n, t) for n, t in state.items() if n in frozen), cast_floats_to)
        self.chunk_bytes = chunk_bytes
        self.own = torch.empty(count, self.own_layout.total_bytes, dtype=torch.uint8).share_memory_()
        self.busy = torch.zeros(count, dtype=torch.int8).share_memory_()  # 1 from write until released
        self.base = torch.empty(self.base_layout.total_bytes, dtype=torch.uint8).share_memory_()
        self.base_id = ""
        if self.base_layout.slots:
            self.base_layout.write(self.base, state)
            self.base_id = base_part_id(byte_view(self.base))

    # -- the trainer's side ------------------------------------------------------------------------
    def write(self, actor: nn.Module, wait_s: float = 0.0) -> int | None:
        """Copy the actor's trainable part into a free buffer; its index, or None when none was free."""
        deadline = time.monotonic() + wait_s
        while True:
            free = (self.busy == 0).nonzero()
            if len(free):
                break
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.005)
        index = int(free[0])
        self.own_layout.write(self.own[index], actor.state_dict())
        self.busy[index] = 1
        return index

    # -- the learner's side ------------------------------------------------------------------------
    def packed(self, index: int) -> PackedWeights:
        """Buffer `index` as weights to serve (numbered when published); serving it hands it back."""
        own = Part(own_part_id(-1), self.own_layout, byte_view(self.own[index]), self.chunk_bytes)
        base = Part(self.base_id, self.base_layout, byte_view(self.base), self.chunk_bytes) if self.base_id else None

        def release() -> None:
            self.busy[index] = 0

        return PackedWeights(-1, own, base, release)

    @property
    def free(self) -> int:
        return int((self.busy == 0).sum())
