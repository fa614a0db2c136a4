"""A token bucket: at most `burst` events at once, then `rate_per_s` a second. It bounds what a peer
can make the learner do (messages per connection, replies to a broken robot, looks at the enrolled
keys on unknown handshakes) without a thread or a timer: tokens refill from the time elapsed."""

from __future__ import annotations

import time


class TokenBucket:
    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate_per_s: float, burst: float, now: float | None = None) -> None:
        self.rate, self.burst = rate_per_s, burst
        self.tokens, self.stamp = burst, time.monotonic() if now is None else now

    def take(self, now: float | None = None) -> bool:
        """Spend one token; False when none is left (the event is refused)."""
        now = time.monotonic() if now is None else now
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True
