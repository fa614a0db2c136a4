"""What the learner knows of one connected robot: its hello, connections and counters.

The ingest keeps one `RobotSession` per robot (its newest stream epoch); `summary()` is the
robot's entry in the learner's status.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from user_rl.cloud.buffer.rows import StreamState
from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import intervened

MAX_CONNECTIONS = 4  # connections that said hello for one session and may speak for it
RATE_WINDOW_ROWS = 1000  # the intervention rate is over about this many recent stored steps


@dataclass
class RobotSession:
    """What the learner knows of one connected robot."""

    robot_id: str
    index: int
    identity: bytes
    descriptor: DeviceDescriptor
    epoch: int
    stream: StreamState
    transitions: int = 0
    episodes: int = 0
    versions: set[int] = field(default_factory=set)
    recent_returns: deque = field(default_factory=lambda: deque(maxlen=20))
    recent_success: deque = field(default_factory=lambda: deque(maxlen=20))
    episode_return: float = 0.0
    last_seen: float = field(default_factory=time.monotonic)
    heartbeat: pb.Heartbeat | None = None  # the edge's newest report of itself, as it came (None: none yet)
    policy_lag: int | None = None  # versions published since the one its newest heartbeat acts with
    streams: int = 1  # stream epochs seen: each restart of the robot's edge daemon starts a new one
    detached: bool = False  # the robot said it is leaving (a clean detach, not a failure)
    stale_transitions: int = 0  # stored rows whose policy lagged more than buffer.max_policy_lag
    lost_batches: int = 0  # batches the edge could not read back from its spool (explicit gaps)
    quarantined_batches: int = 0  # batches refused for their content (a NaN, a wrong shape), kept in the quarantine
    connections: dict[bytes, None] = field(default_factory=dict)  # said hello for it; least recently heard first
    recent_interventions: deque = field(default_factory=deque)  # (rows, intervened rows) per recent batch
    recent_rows: int = 0  # the rows of `recent_interventions`, kept as they come and go (not summed per batch)
    # Older epochs its hello named as spooled (at most lives.MAX_SPOOLED_EPOCHS): their batches are
    # taken, and their stream is made at the first one (a named epoch that sends nothing costs nothing).
    spooled: frozenset[int] = frozenset()

    def admit(self, identity: bytes) -> None:
        """A connection said hello for this session. Beyond `MAX_CONNECTIONS`, the one heard from least
        recently is forgotten: a streaming robot is heard all the time, a replayed hello only once."""
        self.heard(identity)
        while len(self.connections) > MAX_CONNECTIONS:
            del self.connections[next(iter(self.connections))]
        self.identity = identity

    def heard(self, identity: bytes) -> None:
        self.connections.pop(identity, None)
        self.connections[identity] = None

    def take_heartbeat(self, hb: pb.Heartbeat, policy_lag: int | None) -> None:
        """The edge's newest report of itself (`EdgeDaemon.report`), kept as it came; `summary` reports
        it. `policy_lag`: versions published since the one it acts with."""
        self.heartbeat, self.policy_lag = hb, policy_lag

    def summary(self) -> dict:
        hb = self.heartbeat
        heard = hb is not None
        hb = hb or pb.Heartbeat()  # before the first heartbeat: its defaults (unknowns stay None)
        return {
            "transitions": self.transitions,  # stored by this learner since it last heard this robot's hello
            "edge_steps": hb.env_steps if heard else None,  # the edge's own count at its last heartbeat
            "stream_epoch": self.epoch,
            "acked_seq": self.stream.durable_seq,
            "episodes": self.episodes,
            "policy_versions": len([v for v in self.versions if v >= 0]),  # -1: random warm-up
            "latest_version": max(self.versions, default=-1),
            "acting_version": hb.policy_version if heard else None,  # what it acts with, at its last heartbeat
            "policy_lag": self.policy_lag,  # versions published since that one
            "stale_transitions": self.stale_transitions,
            "recent_return": float(np.mean(self.recent_returns)) if self.recent_returns else None,
            "recent_success": float(np.mean(self.recent_success)) if self.recent_success else None,
            "steps_per_second": hb.steps_per_second,
            "backlog_batches": hb.unacked_batches,
            "backlog_bytes": hb.backlog_bytes,
            "dropped_transitions": hb.dropped_transitions,
            "safety_violations": dict(hb.safety_violations),
            "watchdog_holds": hb.watchdog_holds,
            "estopped": hb.estopped or None,
            "rearmed": hb.rearmed or None,  # who re-armed it last, when, and which stop they cleared
            "health": hb.health or "unknown",  # "ok" or what is wrong, as the edge sees it
            "last_error": hb.last_error or None,  # the newest problem the edge met
            "intervention_rate": self.intervention_rate(),  # of its recent stored steps
            "take_overs": hb.take_overs,
            "driver": hb.driver,  # who acts now ("": the policy)
            # latency, chunk age, control-loop jitter
            "inference": {
                "latency_ms": hb.inference_ms,
                "latency_p99_ms": hb.inference_p99_ms,
                "chunk_age_steps": hb.chunk_age_steps,
                "starved_steps": hb.starved_steps,
                "loop_jitter_p99_ms": hb.loop_jitter_p99_ms,
            }
            if heard
            else {},
            "seconds_since_seen": round(time.monotonic() - self.last_seen, 2),
            "edge_restarts": self.streams - 1,
            "detached": self.detached,
            "lost_batches": self.lost_batches,
            "quarantined_batches": self.quarantined_batches,
        }

    def intervention_rate(self) -> float:
        rows = sum(n for n, _ in self.recent_interventions)
        return round(sum(k for _, k in self.recent_interventions) / rows, 4) if rows else 0.0

    def account(self, cols: dict[str, np.ndarray], stale: int = 0) -> None:
        """Counters and recent returns / success / interventions from one stored batch (`stale` of its
        rows lagged more than the buffer's max_policy_lag)."""
        self.transitions += len(cols["reward"])
        self.stale_transitions += stale
        self.recent_interventions.append((len(cols["actor"]), int(np.count_nonzero(intervened(cols["actor"])))))
        self.recent_rows += len(cols["actor"])
        while self.recent_rows - self.recent_interventions[0][0] >= RATE_WINDOW_ROWS:
            self.recent_rows -= self.recent_interventions.popleft()[0]
        self.versions.update(np.unique(cols["policy_version"]).tolist())
        ended = np.flatnonzero(cols["terminated"] | cols["truncated"])
        start = 0
        for row in ended:
            self.episode_return += float(cols["reward"][start : row + 1].sum())
            self.recent_returns.append(self.episode_return)
            self.episode_return = 0.0
            self.episodes += 1
            if cols["label"][row] != pb.LABEL_NONE:
                self.recent_success.append(float(cols["label"][row] == pb.LABEL_SUCCESS))
            start = row + 1
        self.episode_return += float(cols["reward"][start:].sum())
