"""Adapting to a slow uplink: when the unacked backlog grows, send bigger batches (fewer
messages, less per-message overhead) and compress cameras harder; when it drains, go back.

The edge never slows the robot for the link: this only changes how the same steps travel.
"""

from __future__ import annotations

from dataclasses import replace

from user_rl.wire.images import ImageCompression

MIN_JPEG_QUALITY = 50


class BacklogAdapter:
    def __init__(
        self, batch_transitions: int, compression: dict[str, ImageCompression], max_in_flight: int, max_factor: int = 4
    ) -> None:
        self.base_batch = batch_transitions
        self.base_compression = dict(compression)
        self.high = max(2, max_in_flight // 2)  # backlog (batches) that counts as "growing"
        self.low = max(1, max_in_flight // 8)
        self.max_level = max_factor.bit_length() - 1
        self.level = 0

    def update(self, backlog: int) -> tuple[int, dict[str, ImageCompression]]:
        """Batch size and compression to use next, given the backlog in batches."""
        if backlog >= self.high and self.level < self.max_level:
            self.level += 1
        elif backlog <= self.low and self.level > 0:
            self.level -= 1
        return self.base_batch << self.level, self._compression()

    def _compression(self) -> dict[str, ImageCompression]:
        if self.level == 0:
            return self.base_compression
        out = {}
        for key, c in self.base_compression.items():
            if c.format == "jpeg":
                step = (c.quality - MIN_JPEG_QUALITY) * self.level // self.max_level
                c = replace(c, quality=max(MIN_JPEG_QUALITY, c.quality - step))
            out[key] = c
        return out
