"""ZeroMQ ingest: one ROUTER socket that many edges talk to at once.

Per robot it keeps the hello (descriptor and spaces) and the counters the learner reports.
Batches are appended to the persistent buffer strictly in sequence per (robot, epoch) stream:
a re-sent batch is acknowledged again but stored once, and a batch after a gap is not stored
(the ack tells the edge where to resume). Acks are cumulative and sent only once a group
commit has made the batches durable. A batch the edge lost (`lost`, an unreadable spool
file) is stored as an explicit, counted gap; a count-0 batch with an `end_reason` (e-stop,
watchdog hold) ends the stream's open episode; both take their seq like a stored batch.

A session belongs to the connections that said hello for it. ZeroMQ assigns routing ids (no
handover), so a peer replaying a robot's hello gets its own connection next to the robot's,
never instead of it: the robot's batches keep being stored and acked.

Every message that fails to decode or validate is dropped with a counted, logged reason, and
the peer is told why; the socket keeps serving.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
import zmq

from user_rl.cloud.buffer.rows import StreamState
from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.cloud.peer_guard import PeerGuard
from user_rl.config import BufferConfig
from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.security.curve import Gatekeeper, secure_server
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import Message, WireError, decode, encode, envelope
from user_rl.wire.images import decode_columns
from user_rl.wire.spaces import (MAX_NAME_CHARS, MAX_OBSERVATION_KEYS, MAX_TEXT_CHARS, box_from_proto,
                                 descriptor_from_proto, dict_space_from_proto)
from user_rl.wire.transitions import MAX_INDEX_INT, validate_batch

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 4        # connections that said hello for one session and may speak for it
MAX_SPOOLED_EPOCHS = 256   # older epochs one hello may announce (an edge names at most 64)


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
    heartbeat: dict = field(default_factory=dict)
    streams: int = 1  # stream epochs seen: each restart of the robot's edge daemon starts a new one
    detached: bool = False  # the robot said it is leaving (a clean detach, not a failure)
    lost_batches: int = 0  # batches the edge could not read back from its spool (explicit gaps)
    connections: dict[bytes, None] = field(default_factory=dict)  # said hello for it; least recently heard first

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

    def summary(self) -> dict:
        return {
            "transitions": self.transitions,
            "episodes": self.episodes,
            "policy_versions": len([v for v in self.versions if v >= 0]),  # -1: random warm-up
            "latest_version": max(self.versions, default=-1),
            "recent_return": float(np.mean(self.recent_returns)) if self.recent_returns else None,
            "recent_success": float(np.mean(self.recent_success)) if self.recent_success else None,
            "steps_per_second": self.heartbeat.get("steps_per_second", 0.0),
            "backlog_batches": self.heartbeat.get("unacked", 0),
            "backlog_bytes": self.heartbeat.get("backlog_bytes", 0),
            "dropped_transitions": self.heartbeat.get("dropped_transitions", 0),
            "safety_violations": self.heartbeat.get("safety_violations", {}),
            "watchdog_holds": self.heartbeat.get("watchdog_holds", 0),
            "estopped": self.heartbeat.get("estopped"),
            "seconds_since_seen": round(time.monotonic() - self.last_seen, 2),
            "edge_restarts": self.streams - 1,
            "detached": self.detached,
            "lost_batches": self.lost_batches,
        }


class Ingest:
    def __init__(self, context: zmq.Context, endpoint: str, buffer_dir: Path, buffer: BufferConfig | None = None,
                 gamma: float = 0.99, max_rejects_logged: int = 20, gate: Gatekeeper | None = None,
                 max_messages_per_s: float = 2000.0, max_message_bytes: int = 64 << 20) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)  # a bigger frame: ZeroMQ drops the peer
        self.guard = PeerGuard(max_messages_per_s)
        # No ROUTER_HANDOVER: edges do not choose routing ids, ZeroMQ assigns them, so no peer can take
        # over another's connection; a reconnecting edge says hello on its new connection.
        self.gate = gate
        if gate is not None:
            secure_server(self.socket, gate.keys)
        self.socket.bind(endpoint)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.buffer_dir = Path(buffer_dir)
        self.buffer_settings = buffer or BufferConfig()
        self.gamma = gamma
        self.robots: dict[str, RobotSession] = {}
        self.rejected: Counter[str] = Counter()
        self.duplicates = 0
        self.out_of_order = 0
        self.buffer: PersistentReplay | None = None
        self._last_commit = time.monotonic()
        self.obs_space: gym.spaces.Dict | None = None
        self.action_space: gym.spaces.Box | None = None
        self.step_credit = 0  # the same for every stream; used while `credit_increment` is None
        self.credit_increment: int | None = None  # per stream: steps stored + this (0: unpaced)
        self.lost_batches = 0
        self.episode_ends = 0  # count-0 batches that ended an episode (e-stop, hold)
        self._records: dict[int, int] = {}  # stand-in for StreamState.records, by stream id
        self.policy_version = -1
        self._max_logged = max_rejects_logged

    # -- receiving -------------------------------------------------------------------------
    def poll(self, timeout_ms: int = 0, max_messages: int = 256) -> int:
        """Handle waiting messages; return how many were handled."""
        handled = 0
        while handled < max_messages and self.socket.poll(timeout_ms if handled == 0 else 0):
            frames = self.socket.recv_multipart(copy=False)
            handled += 1
            identity = frames[0].bytes
            if not self.guard.admit(identity):  # over its message budget: dropped unread
                continue
            try:
                msg = decode(frames[1:])
                self._check_peer(frames[0].get("User-Id") if self.gate else None, msg)
                self._handle(identity, msg)
            except WireError as exc:
                self._reject(identity, exc)
            except Exception as exc:  # a bug must not take the learner down with it
                log.exception("ingest failed on a message")
                self._reject(identity, WireError("internal_error", repr(exc)[:200]))
        self.maybe_commit()
        return handled

    def maybe_commit(self, force: bool = False) -> None:
        """Group commit: make appended batches durable, then acknowledge them."""
        if self.buffer is None:
            return
        now = time.monotonic()
        if not force and now - self._last_commit < self.buffer_settings.commit_interval_s:
            return
        self._last_commit = now
        for stream in self.buffer.commit():
            session = self.robots.get(stream.record.robot)
            if session is not None:
                self._ack(session, stream)

    def _check_peer(self, peer: str | None, msg: Message) -> None:
        """With CurveZMQ, a message must come from a key enrolled now, speaking for its own robot."""
        if self.gate is None:
            return
        if not self.gate.is_enrolled(peer):
            raise WireError("not_enrolled", f"the key of {peer!r} is not enrolled (revoked?)")
        if msg.envelope.robot_id != peer:
            raise WireError("wrong_robot", f"the key of {peer!r} cannot speak for robot {msg.envelope.robot_id!r}")

    def _handle(self, identity: bytes, msg: Message) -> None:
        kind = msg.kind
        if kind == "hello":
            self._hello(identity, msg)
            return
        session = self.robots.get(msg.envelope.robot_id)
        if session is None or identity not in session.connections:
            raise WireError("no_hello", f"robot {msg.envelope.robot_id!r} sent {kind} before hello")
        session.last_seen = time.monotonic()
        session.heard(identity)
        if kind == "batch":
            self._batch(session, msg, identity)
        elif kind == "heartbeat":
            hb = msg.body
            session.heartbeat = {"env_steps": hb.env_steps, "steps_per_second": hb.steps_per_second,
                                 "policy_version": hb.policy_version, "unacked": hb.unacked_batches,
                                 "backlog_bytes": hb.backlog_bytes, "dropped_transitions": hb.dropped_transitions,
                                 "safety_violations": dict(hb.safety_violations), "watchdog_holds": hb.watchdog_holds,
                                 "estopped": hb.estopped or None}
            if hb.leaving and not session.detached:  # everything it sent is acked: close its episode
                self.buffer.end_open_episodes(session.stream, reason="detached")
                session.detached = True
                log.info("robot %s detached (epoch %d)", session.robot_id, session.epoch)
            self._ack(session, session.stream, to=identity)
        else:
            raise WireError("unexpected", f"{kind} is not accepted on the data link")

    def _hello(self, identity: bytes, msg: Message) -> None:
        hello = msg.body
        robot_id = msg.envelope.robot_id
        if not robot_id or len(robot_id) > MAX_NAME_CHARS or not robot_id.isprintable():
            raise WireError("bad_hello", f"robot id {robot_id[:MAX_NAME_CHARS]!r} is empty, too long or unprintable")
        if hello.stream_epoch > MAX_INDEX_INT:  # epochs are indexed in SQLite (signed 64-bit)
            raise WireError("bad_hello", f"{robot_id}: stream epoch {hello.stream_epoch} is above 2**63 - 1")
        d = hello.descriptor
        if max(len(d.model), len(d.id), len(d.kind)) > MAX_NAME_CHARS or len(d.instruction) > MAX_TEXT_CHARS \
                or len(d.cameras) > MAX_OBSERVATION_KEYS:
            raise WireError("bad_hello", f"{robot_id}: descriptor fields too long")
        try:
            obs_space = dict_space_from_proto(hello.observation_space)
            action_space = box_from_proto(hello.action_space)
        except (TypeError, ValueError) as exc:  # bad dtype name, bounds that do not fit the shape
            raise WireError("bad_hello", f"{robot_id}: unusable spaces: {exc}"[:300]) from None
        if self.obs_space is None:
            try:
                self.open_buffer(obs_space, action_space)
            except ValueError as exc:  # the run's buffer holds other spaces
                raise WireError("spaces_mismatch", str(exc)[:300]) from None
        elif obs_space != self.obs_space or action_space != self.action_space:
            raise WireError("spaces_mismatch", f"{robot_id}: spaces differ from the fleet's (heterogeneous fleets need per-embodiment policies)")
        spooled = self._spooled_epochs(robot_id, hello)
        old = self.robots.get(robot_id)
        descriptor = descriptor_from_proto(hello.descriptor)
        stream = self.buffer.open_stream(robot_id, hello.stream_epoch, descriptor.instruction)
        if old is not None and old.epoch == hello.stream_epoch:
            old.admit(identity)  # another connection of the same stream (a reconnect): keep its place
            session = old
        else:
            session = RobotSession(robot_id=robot_id, index=old.index if old else len(self.robots), identity=identity,
                                   descriptor=descriptor, epoch=hello.stream_epoch, stream=stream)
            session.admit(identity)
            if old is not None:  # a restarted edge: counters carry on, its open episode was cut short
                session.transitions, session.episodes, session.versions = old.transitions, old.episodes, old.versions
                session.streams = old.streams + 1
            self.robots[robot_id] = session
            log.info("robot %s joined (epoch %d, %d batches already stored)", robot_id, hello.stream_epoch,
                     stream.durable_seq)
        for epoch in spooled:  # earlier lives' spools (one may have started and died while we were down)
            older = self.buffer.open_stream(robot_id, epoch, descriptor.instruction)
            self._ack(session, older, gap=True, to=identity)  # where to resume each
        self._ack(session, stream, to=identity)

    def _spooled_epochs(self, robot_id: str, hello: pb.Hello) -> list[int]:
        """The older epochs this hello announces, checked before anything is opened."""
        epochs = sorted(set(hello.spooled_epochs))
        if len(epochs) > MAX_SPOOLED_EPOCHS:
            raise WireError("bad_hello", f"{robot_id}: {len(epochs)} spooled epochs, at most {MAX_SPOOLED_EPOCHS}")
        if epochs and epochs[-1] >= hello.stream_epoch:
            raise WireError("bad_hello", f"{robot_id}: spooled epoch {epochs[-1]} is not older than the "
                                         f"stream epoch {hello.stream_epoch}")
        return epochs

    def open_buffer(self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> None:
        """Open (or reopen after a restart) the run's buffer; the fleet's spaces are fixed from now."""
        self.buffer = PersistentReplay(self.buffer_dir, obs_space, action_space, self.buffer_settings, self.gamma)
        self.obs_space, self.action_space = obs_space, action_space

    def _batch(self, session: RobotSession, msg: Message, identity: bytes) -> None:
        body = msg.body
        stream = self._stream(session, body.stream_epoch)
        expected = stream.record.last_seq + 1
        if body.seq < expected:
            self.duplicates += 1
            self._ack(session, stream, to=identity)
            return
        if body.seq > expected:  # a batch before it was lost in transit: the edge resumes from `expected`
            self.out_of_order += 1
            self._ack(session, stream, gap=True, to=identity)
            return
        if body.lost or (body.end_reason and body.count == 0):
            self._marker(session, stream, msg)
            return
        arrays = decode_columns(msg.arrays, self.obs_space)
        validate_batch(arrays, body.count, self.obs_space, self.action_space)
        self._stream_records(stream)  # counted from what was stored before this batch
        self.buffer.add(stream, body.seq, arrays)
        self._records[stream.record.id] += body.count
        self._account(session, arrays)

    def _stream(self, session: RobotSession, epoch: int) -> StreamState:
        """The stream a batch belongs to: the session's, or an older epoch its hello announced."""
        if epoch == session.epoch:
            return session.stream
        stream = self.buffer.streams.get((session.robot_id, epoch))
        if stream is None:  # the edge says hello again, naming its spooled epochs
            raise WireError("unknown_stream", f"{session.robot_id}: epoch {epoch} was never announced")
        return stream

    def _marker(self, session: RobotSession, stream: StreamState, msg: Message) -> None:
        """A batch without steps that takes its seq: a lost batch (an explicit gap) or an episode end."""
        body = msg.body
        if body.count or msg.arrays or (body.lost and body.end_reason):
            raise WireError("bad_marker", f"{session.robot_id}: a lost or episode-end batch carries no steps "
                                          f"(count {body.count}, {len(msg.arrays)} arrays, end_reason {body.end_reason!r})")
        if len(body.end_reason) > MAX_NAME_CHARS or not body.end_reason.isprintable():
            raise WireError("bad_marker", f"{session.robot_id}: end_reason too long or unprintable")
        if body.lost:
            self.buffer.record_lost(stream, body.seq)
            self.lost_batches += 1
            session.lost_batches += 1
            log.warning("robot %s: batch %d of epoch %d was lost on the edge (unreadable spool file); "
                        "recorded as a gap", session.robot_id, body.seq, stream.record.epoch)
        else:
            self.buffer.end_open_episodes(stream, reason=body.end_reason)
            self.buffer.record_lost(stream, body.seq, counted=False)
            self.episode_ends += 1
            session.episode_return = 0.0

    def _stream_records(self, stream: StreamState) -> int:
        """Step records stored for this stream epoch (also those stored before a learner restart).

        Stand-in until `StreamState.records` (buffer branch) lands: then return that and drop
        `self._records`. Counted once from the index, then kept up to date by `_batch`."""
        sid = stream.record.id
        if sid not in self._records:
            buffer = self.buffer
            row = buffer.index.db.execute("SELECT COALESCE(SUM(records), 0) FROM batches WHERE stream = ?",
                                          (sid,)).fetchone()
            self._records[sid] = (int(row[0]) + sum(n for s, _, n in buffer._open_batches if s == sid)
                                  + sum(n for st, _, n, _ in buffer._pending_commits if st.record.id == sid))
        return self._records[sid]

    def _account(self, session: RobotSession, cols: dict[str, np.ndarray]) -> None:
        session.transitions += len(cols["reward"])
        session.versions.update(np.unique(cols["policy_version"]).tolist())
        ended = np.flatnonzero(cols["terminated"] | cols["truncated"])
        start = 0
        for row in ended:
            session.episode_return += float(cols["reward"][start : row + 1].sum())
            session.recent_returns.append(session.episode_return)
            session.episode_return = 0.0
            session.episodes += 1
            if cols["label"][row] != pb.LABEL_NONE:
                session.recent_success.append(float(cols["label"][row] == pb.LABEL_SUCCESS))
            start = row + 1
        session.episode_return += float(cols["reward"][start:].sum())

    # -- reporting -------------------------------------------------------------------------
    def report(self) -> dict:
        """What the learner's status shows of the ingest (call from the ingest thread: it owns this state)."""
        return {
            "robots": {rid: s.summary() for rid, s in self.robots.items()},
            "rejected": dict(self.rejected),
            "rejected_by_peer": self.guard.report(),
            "keys_refused": dict(self.gate.denied) if self.gate else {},  # handshakes of unknown keys
            "duplicates": self.duplicates,
            "out_of_order": self.out_of_order,
            "buffer_stats": self.buffer.stats() if self.buffer else {},
            "step_credit": self.step_credit,
            "credit_increment": self.credit_increment,
            "lost_batches": self.lost_batches,
            "episode_ends": self.episode_ends,
        }

    # -- replying --------------------------------------------------------------------------
    def _ack(self, session: RobotSession, stream: StreamState, gap: bool = False, to: bytes | None = None) -> None:
        """Cumulative ack of the stream's durable batches; after a gap, also where to resume.

        Sent to `to` (the connection that asked), or to every connection of the session."""
        ack = pb.Ack(stream_epoch=stream.record.epoch, seq=stream.durable_seq,
                     next_seq=stream.record.last_seq + 1 if gap else 0,
                     step_credit=self._step_credit(stream), policy_version=self.policy_version)
        frames = encode(envelope(session.robot_id, ack=ack))
        for identity in [to] if to is not None else list(session.connections):
            self.socket.send_multipart([identity, *frames])

    def _step_credit(self, stream: StreamState) -> int:
        """The env steps this stream epoch may have taken: what is stored of it plus the increment
        (0: unpaced), so a restart of the learner or the edge never leaves it below what is done."""
        if self.credit_increment is None:
            return self.step_credit
        if self.credit_increment == 0:
            return 0
        return self._stream_records(stream) + self.credit_increment

    def push_credit(self) -> None:
        """Tell every robot its new step credit and the newest policy version."""
        for session in self.robots.values():
            self._ack(session, session.stream)

    def _reject(self, identity: bytes, exc: WireError) -> None:
        self.rejected[exc.reason] += 1
        if self.rejected[exc.reason] <= self._max_logged:
            log.warning("rejected a message from %r: %s", identity[:64], exc)
        if self.guard.reject(identity, exc.reason):  # a peer sending garbage is not answered at its rate
            reject = envelope(reject=pb.Reject(reason=str(exc)[:500]))
            self.socket.send_multipart([identity, *encode(reject)])

    def close(self) -> None:
        """Stop serving; seal and close the buffer (everything acked is on disk already)."""
        self.socket.close(0)
        if self.buffer is not None:
            self.buffer.close()
