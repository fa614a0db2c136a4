"""Step credit for paced fleets: how many env steps each stream epoch may have taken.

A paced sim steps only while its own step count (since its edge started, i.e. in its stream
epoch) is below the credit its last ack carried. Credit is per stream: what the learner has
stored of that stream plus an increment the learner sets from its update rate, so a restarted
learner or edge can never leave a stream's credit below what it has already done (the
deadlock of an absolute, fleet-wide count).

Grants only grow (an edge may already have stepped on an earlier one), and with a step budget
(`stop.max_env_steps`) the steps promised but not yet stored never exceed what is left of it.
The ingest forgets the grant of an edge that has gone silent (dead, or failed for good), so its
unused steps go back to the rest of the fleet:

    credit = StepCredit()
    credit.increment, credit.max_records = 96, 600   # increment None: unpaced
    ack.step_credit = credit.grant(stream, stored=buffer.records)
"""

from __future__ import annotations

from user_rl.cloud.buffer.rows import StreamState


class StepCredit:
    def __init__(self) -> None:
        self.increment: int | None = None  # None: unpaced (acks carry 0 = no limit); may be negative
        self.max_records: int | None = None  # the run's step budget, all robots together
        self._granted: dict[int, tuple[StreamState, int]] = {}  # stream id -> (stream, credit granted)

    def grant(self, stream: StreamState, stored: int) -> int:
        """The credit for `stream`'s next ack, given `stored` step records of the whole run."""
        if self.increment is None:
            return 0
        sid = stream.record.id
        granted = self._granted.get(sid, (stream, 0))[1]
        want = stream.records + self.increment
        if want > granted and self.max_records is not None:
            promised = sum(max(0, g - s.records) for other, (s, g) in self._granted.items() if other != sid)
            room = self.max_records - stored - promised  # steps nobody has been promised yet
            want = min(want, stream.records + max(0, room))
        granted = max(granted, want, 1)  # never 0, which would mean "no limit"
        self._granted[sid] = (stream, granted)
        return granted

    def forget(self, stream: StreamState) -> None:
        """The stream's edge is gone (restarted under a new epoch, detached, silent): its unused
        credit goes back to the budget. (If a silent edge comes back, it is granted afresh.)"""
        self._granted.pop(stream.record.id, None)

    def outstanding(self) -> int:
        """Steps granted and not yet stored, over all streams."""
        return sum(max(0, g - s.records) for s, g in self._granted.values())
