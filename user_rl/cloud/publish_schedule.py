"""When the trainer hands its actor back to be published (`learner.publish_every_s`, ...).

A fixed count of updates ties the edges' freshness to the update rate: 50 updates are 0.6 s on a
CPU core and 25 ms on a GPU, and a VLA's 50 updates are minutes. Edges act with what they have,
so what matters to them is time: a small actor goes out every `publish_every_s` (0.1 s: within
a control period or two of a 10 Hz arm). Bytes bound it from the other side: each edge fetches
every version it is told of, so a version of `actor_bytes` goes out at most every
`actor_bytes / publish_max_bytes_per_s` seconds, whatever else is due: at the default 2 MB/s (16 Mbit/s
of a robot's link, and of a 2-core box's CPU when its sims fetch and load every version) an 80 KB
MLP goes every 0.1 s, a 1 MB tiny VLA every 0.5 s, a 200 MB one every 100 s. Only the trainable
part counts: a frozen base travels once. `publish_every_updates` publishes after that many updates as well (or instead).

The trainer asks `due` after each update; a clock read and a few comparisons, no host sync.
"""

from __future__ import annotations

import math


class PublishSchedule:
    """Whether the actor after `updates` updates is due to go out, given when the last one went."""

    def __init__(
        self, every_s: float | None, every_updates: int | None, max_bytes_per_s: float | None, actor_bytes: int = 0
    ) -> None:
        if every_s is None and every_updates is None:
            raise ValueError("a publish schedule needs every_s or every_updates")
        self.every_s, self.every_updates = every_s, every_updates
        self.max_bytes_per_s = max_bytes_per_s
        self.actor_bytes = actor_bytes  # known once the actor is first packed (`set_actor_bytes`)
        self._last_s = -math.inf
        self._last_updates: int | None = None

    def set_actor_bytes(self, actor_bytes: int) -> None:
        self.actor_bytes = actor_bytes

    @property
    def min_interval_s(self) -> float:
        """The shortest time between two versions the byte cap allows."""
        if not self.max_bytes_per_s:
            return 0.0
        return self.actor_bytes / self.max_bytes_per_s

    def due(self, updates: int, now: float) -> bool:
        """Whether the actor after `updates` updates goes out at `now` (monotonic seconds).
        The first actor always does: the edges wait for it."""
        if self._last_updates is None:
            return True
        if updates <= self._last_updates:
            return False
        since = now - self._last_s
        if since < self.min_interval_s:
            return False
        by_time = self.every_s is not None and since >= self.every_s
        # a multiple of every_updates reached since the last one (50, 100, ...: a skipped one is not lost)
        by_updates = (
            self.every_updates is not None and updates // self.every_updates > self._last_updates // self.every_updates
        )
        return by_time or by_updates

    def published(self, updates: int, now: float) -> None:
        """The actor after `updates` updates went out at `now`."""
        self._last_updates, self._last_s = updates, now
