"""Per-peer limits on the learner's sockets: a message budget (token bucket) per connection, and
rejection counters per peer, so one flooding or broken robot can neither starve the others nor
make the learner flood it with replies.

    guard = PeerGuard(rate_per_s=2000)
    if not guard.admit(identity):            # over budget: dropped unread, counted
        continue
    ...
    if guard.reject(identity, "frame_size"): # counted; True while replies to it are still due
        send_reject(...)
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict

from user_rl.token_bucket import TokenBucket

REPLIES_PER_S = 10.0  # rejection replies to one peer (after a burst of REPLY_BURST); beyond, only counted
REPLY_BURST = 50.0
OTHER_PEERS = "(other peers)"  # rejections of peers beyond the first `max_named` ones, counted together


class _Peer:
    """One connection's budgets: messages it may send, rejection replies it may still get."""

    __slots__ = ("messages", "replies")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.messages = TokenBucket(rate, burst, now)
        self.replies = TokenBucket(REPLIES_PER_S, REPLY_BURST, now)


class PeerGuard:
    def __init__(self, rate_per_s: float, burst_s: float = 1.0, max_peers: int = 4096, max_named: int = 64) -> None:
        self.rate = rate_per_s
        self.burst = max(1.0, rate_per_s * burst_s)
        self.max_peers = max_peers
        self.max_named = max_named  # peers named in the rejection report (it goes into the status)
        self._peers: OrderedDict[bytes, _Peer] = OrderedDict()  # least recently heard first
        self.rejected: dict[str, Counter[str]] = {}

    def admit(self, peer: bytes) -> bool:
        """Spend one message of this peer's budget; False when it has none left (drop the message)."""
        now = time.monotonic()
        if self._peer(peer, now).messages.take(now):
            return True
        self._count(peer, "rate_limited")
        return False

    def reject(self, peer: bytes, reason: str) -> bool:
        """Count a rejected message; True if the peer should still be told (10 replies/s after a burst)."""
        self._count(peer, reason)
        now = time.monotonic()
        return self._peer(peer, now).replies.take(now)

    def report(self) -> dict[str, dict[str, int]]:
        """Rejections per peer (its routing id as text) and reason."""
        return {peer: dict(counts) for peer, counts in self.rejected.items()}

    def _peer(self, peer: bytes, now: float) -> _Peer:
        budgets = self._peers.get(peer)
        if budgets is None:
            budgets = self._peers[peer] = _Peer(self.rate, self.burst, now)
            while len(self._peers) > self.max_peers:  # forget the quietest; a new peer starts full
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(peer)
        return budgets

    def _count(self, peer: bytes, reason: str) -> None:
        name = peer.decode("utf-8", "replace")[:128]
        if name not in self.rejected and len(self.rejected) >= self.max_named:
            name = OTHER_PEERS
        self.rejected.setdefault(name, Counter())[reason] += 1
