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

Bounded under hostile load: a message is read frame by frame and dropped once it is over
`max_message_bytes` in total; a hello is compared with the known spaces before anything its
size is built; robots not heard from for `forget_idle_s` (and beyond `max_robots` the
longest-idle) leave memory and the status, and come back with a new hello. A buffer write
error stops the ingest taking data: nothing after it is acked, and `report()["failure"]` says why.

Every message that fails to decode or validate is dropped with a counted, logged reason, and
the peer is told why; the socket keeps serving. A batch next in its stream whose content is
refused (a NaN, a wrong shape: the same every time it is sent) is kept in the quarantine
(quarantine.py) and takes its seq like a lost batch: its ack says it was refused and why, and
the stream goes on; the robot's status counts it (`quarantined_batches`).
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import gymnasium as gym
import numpy as np
import zmq

from user_rl.cloud.buffer.rows import StreamState
from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.cloud.buffer.writer import BufferWriter
from user_rl.cloud.credit import StepCredit
from user_rl.cloud.fleet_status import status_reply
from user_rl.cloud.lives import resume_acks, spooled_epochs
from user_rl.cloud.peer_guard import PeerGuard
from user_rl.cloud.quarantine import MAX_BYTES as QUARANTINE_MAX_BYTES
from user_rl.cloud.quarantine import Quarantine
from user_rl.cloud.sessions import RobotSession
from user_rl.cloud.staleness import LagCounts, PublishedVersions, UpdateLags, row_lags, stale_rows
from user_rl.config import BufferConfig
from user_rl.security.curve import Gatekeeper, secure_server, split_user_id
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import MAX_ARRAYS_PER_MESSAGE, Message, WireError, decode, encode, envelope
from user_rl.wire.images import decode_columns
from user_rl.wire.spaces import (
    MAX_NAME_CHARS,
    MAX_OBSERVATION_KEYS,
    MAX_TEXT_CHARS,
    descriptor_from_proto,
    hello_spaces,
)
from user_rl.wire.transitions import EDGE_RESTART, MAX_INDEX_INT, validate_batch

log = logging.getLogger(__name__)
# What a failing disk raises from the buffer (its BufferWriteError is an OSError; the index is SQLite).
STORAGE_ERRORS = (OSError, sqlite3.Error)
STORAGE_FAILED = "learner_storage_failed"  # the reject reason edges retry on (they keep spooling)
DECODED_PER_MESSAGE = 4  # compressed images in a message may decode to this many times max_message_bytes
FORGET_CHECK_S = 1.0  # how often idle robots are looked for
CREDIT_IDLE_S = 10.0  # a paced edge heartbeats while it waits for credit: this silent, it is gone

COMMIT_CHECK_MS = 2  # while a group commit runs, a waiting poll looks this often whether it is done
RECEIVE_QUEUE_MESSAGES = 128  # per connection: an edge has at most fleet.max_in_flight (64) batches unacked


class BufferOpener(Protocol):
    """Opens the run's buffer once the fleet's spaces are known (the learner's: it owns the buffer)."""

    def __call__(self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> BufferWriter: ...


class Ingest:
    def __init__(
        self,
        context: zmq.Context,
        endpoint: str,
        buffer_dir: Path,
        buffer: BufferConfig | None = None,
        gamma: float = 0.99,
        max_rejects_logged: int = 20,
        gate: Gatekeeper | None = None,
        max_messages_per_s: float = 2000.0,
        max_message_bytes: int = 64 << 20,
        max_robots: int = 1024,
        forget_idle_s: float = 600.0,
        max_quarantine_bytes: int = QUARANTINE_MAX_BYTES,
        open_buffer: BufferOpener | None = None,
        credit: StepCredit | None = None,
        published: PublishedVersions | None = None,
        status: Callable[[], dict] | None = None,
        updates: Callable[[], int] | None = None,
    ) -> None:
        """What the ingest needs from its owner (the learner), all optional for an ingest on its own:
        `open_buffer` makes the run's buffer when the spaces are fixed (default: one in `buffer_dir`),
        `credit` is the paced fleet's step credit its acks carry, `published` the policy versions
        published so far (lags count them), `status` answers `user-rl status` requests (default:
        the robots' rows of `report()`), and `updates` counts the learner's updates (lags in updates)."""
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        # A bigger frame: ZeroMQ drops the peer. A bigger message of many frames: dropped in `_receive`.
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        # Messages one connection may have queued here unread; beyond, ZeroMQ stops reading its TCP
        # connection (the peer waits, its data stays on its side). libzmq has no frame-count limit and
        # hands a multipart message over only whole, so this and MAXMSGSIZE are what bound it.
        self.socket.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE_MESSAGES)
        self.max_message_bytes = max_message_bytes
        self.max_robots = max_robots
        self.forget_idle_s = forget_idle_s
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
        self.robots: OrderedDict[str, RobotSession] = OrderedDict()  # the longest-idle first
        self.forgotten = 0  # robots dropped from memory (idle, or beyond max_robots)
        self._sessions_made = 0
        self._forget_checked = time.monotonic()
        self.failure: str | None = None  # set once a buffer write failed: no data is taken or acked after it
        self.rejected: Counter[str] = Counter()
        self.duplicates = 0
        self.out_of_order = 0
        self.buffer: BufferWriter | None = None  # the owner's (the learner's), or its own when it has none
        self._own_buffer: PersistentReplay | None = None  # opened here (an ingest on its own): closed here
        self._last_commit = time.monotonic()
        self.obs_space: gym.spaces.Dict | None = None
        self.action_space: gym.spaces.Box | None = None
        # paced fleets: the owner sets its increment and the step budget
        self.credit = credit if credit is not None else StepCredit()
        self.lost_batches = 0
        self.episode_ends = 0  # count-0 batches that ended an episode (e-stop, hold)
        self.quarantine = Quarantine.of_buffer(self.buffer_dir, max_quarantine_bytes)  # batches refused for content
        self.published = published if published is not None else PublishedVersions()
        self.stale_transitions = 0  # stored rows whose policy lagged more than buffer.max_policy_lag
        self.lag_counts = LagCounts()  # stored rows the policy acted, by their lag
        self.update_lags = UpdateLags()  # and their lag in updates (publish(version, updates) feeds it)
        self._updates = updates or (lambda: 0)
        self._status = status or (lambda: {"robots": self.report()["robots"]})  # for `user-rl status` requests
        self._open_buffer: BufferOpener = open_buffer or self._open_own_buffer
        self._max_logged = max_rejects_logged

    # -- receiving -------------------------------------------------------------------------
    def poll(self, timeout_ms: int = 0, max_messages: int = 256) -> int:
        """Handle waiting messages; return how many were handled."""
        handled = 0
        if self.buffer is not None and self.buffer.commit_running:
            timeout_ms = min(timeout_ms, COMMIT_CHECK_MS)  # its acks go out soon after the disk is done
        while handled < max_messages and self.socket.poll(timeout_ms if handled == 0 else 0):
            routing, frames, refused = self._receive()
            handled += 1
            identity = routing.bytes
            if not self.guard.admit(identity):  # over its message budget: dropped unread
                continue
            try:
                if refused is not None:
                    raise refused
                msg = decode(frames)
                self._check_peer(routing.get("User-Id") if self.gate else None, msg)
                if self.failure is not None:  # nothing is stored or acked after a buffer write error
                    raise WireError(STORAGE_FAILED, self.failure)
                self._handle(identity, msg)
            except WireError as exc:
                self._reject(identity, exc)
            except STORAGE_ERRORS as exc:  # the disk failed under add / seal / open: never ack past it
                self._storage_failed(exc)
                self._reject(identity, WireError(STORAGE_FAILED, self.failure or ""))
            except Exception as exc:  # a bug must not take the learner down with it
                log.exception("ingest failed on a message")
                self._reject(identity, WireError("internal_error", repr(exc)[:200]))
        self.maybe_commit()
        self._forget_idle()
        return handled

    def _receive(self) -> tuple[zmq.Frame, list[zmq.Frame], WireError | None]:
        """One message, frame by frame: (routing frame, the message's frames, why it is refused).
        Past `max_message_bytes` in total (or too many frames) the rest is read and dropped,
        so an oversized message never sits in memory whole on this side."""
        routing = self.socket.recv(copy=False)
        frames: list[zmq.Frame] = []
        total, refused = 0, None
        more = routing.more
        while more:
            frame = self.socket.recv(copy=False)
            more = frame.more
            if refused is not None:
                continue  # dropped as it arrives
            total += len(frame)
            if total > self.max_message_bytes:
                refused = WireError(
                    "message_too_large",
                    f"over {self.max_message_bytes / 2**20:g} MiB in total "
                    "(learner.max_message_mb, counted over all frames)",
                )
            elif len(frames) > MAX_ARRAYS_PER_MESSAGE:  # the envelope and its arrays
                refused = WireError("too_many_arrays", f"more than {MAX_ARRAYS_PER_MESSAGE} arrays")
            if refused is not None:
                frames.clear()
            else:
                frames.append(frame)
        return routing, frames, refused

    def maybe_commit(self, force: bool = False) -> None:
        """Group commit: make appended batches durable, then acknowledge them.

        Every `commit_interval_s` a group commit starts on the buffer's commit thread, and the
        batches it covered are acked once it is done (seen here, at a later call): the ingest
        goes on decoding and storing while the disk syncs, instead of waiting for it. `force`
        commits at once, waiting for the disk (before an episode ends in the index)."""
        if self.buffer is None or self.failure is not None:
            return
        try:
            advanced = self.buffer.finish_commit()
            now = time.monotonic()
            if force:
                self._last_commit = now
                advanced += self.buffer.commit()
            elif now - self._last_commit >= self.buffer_settings.commit_interval_s and self.buffer.start_commit():
                self._last_commit = now
        except STORAGE_ERRORS as exc:  # not durable: none of it is acked, now or later
            self._storage_failed(exc)
            return
        for stream in {id(s): s for s in advanced}.values():
            session = self.robots.get(stream.record.robot)
            if session is not None:
                self._ack(session, stream)

    def _check_peer(self, peer: str | None, msg: Message) -> None:
        """With CurveZMQ, a message must come from a key enrolled now (by key: a revoked key stays
        out after its robot is enrolled again with a new one), speaking for its own robot.
        `peer` is the message's `User-Id`, "<robot id>/<key>" (see security.curve)."""
        if self.gate is None:
            return
        robot_id, _ = split_user_id(peer)
        if not self.gate.is_enrolled(peer):
            raise WireError("not_enrolled", f"the key of {robot_id!r} is not enrolled (revoked?)")
        if msg.envelope.robot_id != robot_id:
            raise WireError("wrong_robot", f"the key of {robot_id!r} cannot speak for robot {msg.envelope.robot_id!r}")

    def _handle(self, identity: bytes, msg: Message) -> None:
        kind = msg.kind
        if kind == "hello":
            self._hello(identity, msg)
            return
        if kind == "status_request":  # `user-rl status ADDRESS`: no robot, no hello
            reply = status_reply(self._status())
            self.socket.send_multipart([identity, *encode(envelope(status_reply=reply))])
            return
        session = self.robots.get(msg.envelope.robot_id)
        if session is None or identity not in session.connections:
            raise WireError("no_hello", f"robot {msg.envelope.robot_id!r} sent {kind} before hello")
        self._touch(session)
        session.heard(identity)
        if kind == "batch":
            self._batch(session, msg, identity)
        elif kind == "heartbeat":
            hb = msg.body
            session.take_heartbeat(hb, self._lag(hb.policy_version))
            if hb.leaving and not session.detached:  # everything it sent is acked: close its episode
                self.buffer.end_open_episodes(session.stream, reason="detached")
                session.detached = True
                self.credit.forget(session.stream)
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
        if (
            max(len(d.model), len(d.id), len(d.kind)) > MAX_NAME_CHARS
            or len(d.instruction) > MAX_TEXT_CHARS
            or len(d.cameras) > MAX_OBSERVATION_KEYS
        ):
            raise WireError("bad_hello", f"{robot_id}: descriptor fields too long")
        self._check_spaces(robot_id, hello)
        spooled = spooled_epochs(robot_id, hello)
        old = self.robots.get(robot_id)
        descriptor = descriptor_from_proto(hello.descriptor)
        if old is not None and old.epoch == hello.stream_epoch:
            old.admit(identity)  # another connection of the same stream (a reconnect): keep its place
            session = old
        else:
            # Nothing is stored for a hello: a stream is made when its first batch arrives (`_stream`).
            stream = self.buffer.stream(robot_id, hello.stream_epoch) or self.buffer.unstored_stream(
                robot_id, hello.stream_epoch, descriptor.instruction
            )
            if old is None:
                self._make_room()
                self._sessions_made += 1
            session = RobotSession(
                robot_id=robot_id,
                index=old.index if old else self._sessions_made - 1,
                identity=identity,
                descriptor=descriptor,
                epoch=hello.stream_epoch,
                stream=stream,
            )
            session.admit(identity)
            if old is not None:  # a restarted edge: counters carry on, its open episode was cut short
                self.credit.forget(old.stream)
                session.transitions, session.episodes, session.versions = old.transitions, old.episodes, old.versions
                session.streams = old.streams + 1
                session.stale_transitions = old.stale_transitions
                session.quarantined_batches = old.quarantined_batches
            self.robots[robot_id] = session
            log.info(
                "robot %s joined (epoch %d, %d batches already stored)",
                robot_id,
                hello.stream_epoch,
                stream.durable_seq,
            )
        session.spooled = frozenset(spooled)
        self._touch(session)
        if old is None or hello.stream_epoch >= old.epoch:  # a stale hello (a dead life's, late) ends nothing
            self._end_finished_lives(robot_id, hello.stream_epoch, session.spooled, hello.more_spooled_epochs)
        if old is not None and old is not session:
            self.buffer.release_stream(old.stream)  # drained: a batch of it (named as spooled) reloads it
        self._ack_positions(session, spooled, to=identity)  # where each earlier life's spool resumes
        self._ack(session, session.stream, to=identity)

    def _end_finished_lives(self, robot_id: str, epoch: int, spooled: frozenset[int], more_spooled: bool) -> None:
        """End the open episode of each older epoch of the robot whose edge life is over and whose data
        has all arrived (not named as spooled), as `edge_restart`. Named ones end with their own
        marker, after their data. Everything stored before is committed first, so the index never
        holds an ended episode longer than what a crash leaves of it."""
        finished = self.buffer.finished_streams(robot_id, epoch, spooled, more_spooled)
        if not finished:
            return
        self.maybe_commit(force=True)
        for stream in finished:
            self.credit.forget(stream)
        self.buffer.end_lives(finished)

    def _ack_positions(self, session: RobotSession, epochs: list[int], to: bytes) -> None:
        """Where each announced older epoch stands (`lives.resume_acks`)."""
        if self.failure is None:
            for ack in resume_acks(self.buffer, session.robot_id, epochs, self.policy_version):
                self.socket.send_multipart([to, *encode(envelope(session.robot_id, ack=ack))])

    def _check_spaces(self, robot_id: str, hello: pb.Hello) -> None:
        """A hello's spaces must be the fleet's; the first hello of a fresh ingest opens the buffer."""
        spaces = hello_spaces(robot_id, hello, self.obs_space, self.action_space, self.max_message_bytes)
        if spaces is None:
            return
        try:
            self.open_buffer(*spaces)
        except ValueError as exc:  # the run's buffer holds other spaces
            raise WireError("spaces_mismatch", str(exc)[:300]) from None

    def open_buffer(self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> None:
        """Open (or reopen after a restart) the run's buffer; the fleet's spaces are fixed from now."""
        self.buffer = self._open_buffer(obs_space, action_space)
        self.obs_space, self.action_space = obs_space, action_space

    def _open_own_buffer(self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> BufferWriter:
        if self._own_buffer is not None:
            self._own_buffer.close()
        self._own_buffer = PersistentReplay(self.buffer_dir, obs_space, action_space, self.buffer_settings, self.gamma)
        return self._own_buffer

    def _batch(self, session: RobotSession, msg: Message, identity: bytes) -> None:
        body = msg.body
        stream = self._stream(session, body.stream_epoch, body.seq)
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
        try:
            arrays = decode_columns(
                msg.arrays, self.obs_space, body.count, DECODED_PER_MESSAGE * self.max_message_bytes
            )
            validate_batch(arrays, body.count, self.obs_space, self.action_space, body.people)
        except WireError as exc:  # its content: sent again it would be refused again
            self._quarantine(session, stream, msg, exc, identity)
            return
        arrays["policy_lag"] = row_lags(arrays, self.published)
        self.buffer.add(stream, body.seq, arrays, body.people)
        self.lag_counts.add(arrays["policy_lag"], arrays)
        self.update_lags.add(arrays, self._updates())
        stale = int(np.count_nonzero(stale_rows(arrays["policy_lag"], self.buffer_settings.max_policy_lag)))
        self.stale_transitions += stale
        session.account(arrays, stale)

    def _quarantine(
        self, session: RobotSession, stream: StreamState, msg: Message, exc: WireError, identity: bytes
    ) -> None:
        """Refuse a batch for its content without stopping its stream: keep it in the quarantine, take
        its seq like a lost batch (the row before it gets no successor; its episode goes on or is
        ended by the edge), count it, and tell the sender in an ack why."""
        self.buffer.record_lost(stream, msg.body.seq, counted=False)
        self.quarantine.keep(msg, str(exc))
        self.rejected[exc.reason] += 1
        session.quarantined_batches += 1
        self._ack(session, stream, to=identity, refused=(msg.body.seq, str(exc)))

    def _stream(self, session: RobotSession, epoch: int, seq: int = 0) -> StreamState:
        """The stream a batch belongs to: the session's, or an older epoch its hello announced. A
        stream is made by its first batch (seq 1): before, a stand-in answers (nothing stored)."""
        if epoch == session.epoch:
            stream = session.stream
        else:
            stream = self.buffer.stream(session.robot_id, epoch)  # reloaded from the index if released
            if stream is None and epoch in session.spooled:
                stream = self.buffer.unstored_stream(session.robot_id, epoch, session.descriptor.instruction)
            if stream is None:  # the edge says hello again, naming its spooled epochs
                raise WireError("unknown_stream", f"{session.robot_id}: epoch {epoch} was never announced")
        if stream.record.id < 0 and seq == stream.record.last_seq + 1:  # its first batch: store from now on
            made = self.buffer.open_stream(session.robot_id, epoch, stream.record.task, session.descriptor.control_hz)
            if stream is session.stream:
                self.credit.forget(stream)
                session.stream = made
            stream = made
        return stream

    def _marker(self, session: RobotSession, stream: StreamState, msg: Message) -> None:
        """A batch without steps that takes its seq: a lost batch (an explicit gap) or an episode end."""
        body = msg.body
        if body.count or msg.arrays or (body.lost and body.end_reason):
            raise WireError(
                "bad_marker",
                f"{session.robot_id}: a lost or episode-end batch carries no steps "
                f"(count {body.count}, {len(msg.arrays)} arrays, end_reason {body.end_reason!r})",
            )
        if len(body.end_reason) > MAX_NAME_CHARS or not body.end_reason.isprintable():
            raise WireError("bad_marker", f"{session.robot_id}: end_reason too long or unprintable")
        if body.lost:
            self.buffer.record_lost(stream, body.seq)
            self.lost_batches += 1
            session.lost_batches += 1
            log.warning(
                "robot %s: batch %d of epoch %d was lost on the edge (unreadable spool file); recorded as a gap",
                session.robot_id,
                body.seq,
                stream.record.epoch,
            )
        else:
            self.maybe_commit(force=True)  # what it ends is durable before the index says it ended
            self.buffer.end_open_episodes(stream, reason=body.end_reason)
            self.buffer.record_lost(stream, body.seq, counted=False)
            self.episode_ends += 1
            if stream is session.stream:
                session.episode_return = 0.0
            elif body.end_reason == EDGE_RESTART:  # a dead life's epoch has fully arrived: it leaves RAM
                self.buffer.release_stream(stream)

    # -- reporting -------------------------------------------------------------------------
    def report(self) -> dict:
        """What the learner's status shows of the ingest (call from the ingest thread: it owns this state)."""
        keys_refused, refusals = self.gate.denied_report() if self.gate else ({}, 0)
        return {
            "robots": {rid: s.summary() for rid, s in self.robots.items()},  # at most max_robots
            "robots_forgotten": self.forgotten,
            "rejected": dict(self.rejected),
            "rejected_by_peer": self.guard.report(),
            "keys_refused": keys_refused,  # handshakes of unknown or revoked keys: the most recent keys
            "keys_refused_total": refusals,
            "failure": self.failure,
            "duplicates": self.duplicates,
            "out_of_order": self.out_of_order,
            "buffer_stats": self.buffer.stats() if self.buffer else {},
            "credit_increment": self.credit.increment,
            "credit_outstanding": self.credit.outstanding(),
            "lost_batches": self.lost_batches,
            "episode_ends": self.episode_ends,
            "quarantine": self.quarantine.report(),  # batches refused for their content (per robot in "robots")
            "stale_transitions": self.stale_transitions,
            "policy_lag_counts": self.lag_counts.counts.tolist(),  # stored rows the policy acted, by lag (last: more)
            "policy_lag_updates": self.update_lags.report(),  # the last rows' lags in updates: p50, p90, p99, max
        }

    # -- replying --------------------------------------------------------------------------
    def _ack(
        self,
        session: RobotSession,
        stream: StreamState,
        gap: bool = False,
        to: bytes | None = None,
        refused: tuple[int, str] | None = None,
    ) -> None:
        """Cumulative ack of the stream's durable batches; after a gap, also where to resume; with
        `refused` (seq, reason), that this batch was refused and quarantined.

        Sent to `to` (the connection that asked), or to every connection of the session."""
        if self.failure is not None:  # after a buffer write error no ack may cover what was not committed
            return
        ack = pb.Ack(
            stream_epoch=stream.record.epoch,
            seq=stream.durable_seq,
            next_seq=stream.record.last_seq + 1 if gap else 0,
            step_credit=self._step_credit(session, stream),
            policy_version=self.policy_version,
        )
        if refused is not None:
            ack.refused_seq, ack.refused_reason = refused[0], refused[1][:500]
        frames = encode(envelope(session.robot_id, ack=ack))
        for identity in [to] if to is not None else list(session.connections):
            self.socket.send_multipart([identity, *frames])

    def _step_credit(self, session: RobotSession, stream: StreamState) -> int:
        """The env steps the robot's live stream epoch may have taken (credit.py); an older epoch's
        edge is gone, so its acks promise nothing."""
        if stream is not session.stream or self.buffer is None:
            return 0
        return self.credit.grant(stream, self.buffer.records)

    def _lag(self, version: int) -> int | None:
        """Versions published after `version` (None: the robot acts without a policy yet)."""
        return int(self.published.behind(np.array([version]))[0]) if version >= 0 else None

    def publish(self, version: int, updates: int = 0) -> None:
        """A new policy version is out, holding the actor after `updates` updates: acks name it, and
        rows of older ones count as lagging behind it."""
        self.published.add(version)
        self.update_lags.published(version, updates)

    @property
    def policy_version(self) -> int:
        """The newest version published (-1: none yet)."""
        return self.published.newest

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

    # -- failures and forgetting ------------------------------------------------------------
    def _storage_failed(self, exc: BaseException) -> None:
        """A buffer write failed: from now on nothing is stored or acked; say so once, loudly."""
        if self.failure is not None:
            return
        code = getattr(exc, "errno", None)
        name = errno.errorcode.get(code, type(exc).__name__) if isinstance(code, int) else type(exc).__name__
        detail = (self.buffer.failure if self.buffer is not None else None) or str(exc)
        self.failure = (
            f"buffer write failed in {self.buffer_dir}: {name} ({detail})"[:400] + "; the learner takes "
            "no more data and acks nothing after it (edges keep their spools): fix the disk and restart "
            "the learner"
        )
        log.critical("%s", self.failure, exc_info=exc)

    def _touch(self, session: RobotSession) -> None:
        session.last_seen = time.monotonic()
        self.robots.move_to_end(session.robot_id)

    def _make_room(self) -> None:
        """Before a new robot joins: at most max_robots are kept, the longest-idle leave first."""
        while len(self.robots) >= self.max_robots:
            self._forget(next(iter(self.robots.values())), "max_robots")

    def _forget_idle(self) -> None:
        now = time.monotonic()
        if now - self._forget_checked < FORGET_CHECK_S:
            return
        self._forget_checked = now
        for session in self.robots.values():  # the longest-idle first
            if now - session.last_seen < CREDIT_IDLE_S:
                break
            self.credit.forget(session.stream)  # a dead edge's unused steps go back to the budget
        while self.robots:
            oldest = next(iter(self.robots.values()))
            if now - oldest.last_seen < self.forget_idle_s:
                break
            self._forget(oldest, "idle")

    def _forget(self, session: RobotSession, why: str) -> None:
        """Drop a robot from memory and the status; its stored data stays. If it comes back, it
        says hello again and continues (its counters here restart)."""
        del self.robots[session.robot_id]
        self.credit.forget(session.stream)
        self.forgotten += 1
        if self.forgotten <= self._max_logged:
            log.info(
                "forgot robot %s (%s, last heard %.0f s ago)",
                session.robot_id,
                why,
                time.monotonic() - session.last_seen,
            )
        if self.buffer is not None:  # its stream leaves RAM (at the next seal if it has uncommitted data)
            self.buffer.release_stream(session.stream)  # a hello reloads it from the index

    def close(self) -> None:
        """Stop serving (everything acked is on disk already); a buffer it opened itself is sealed and
        closed here, the owner's by its owner. After a write failure nothing more is written: the
        next start recovers what was committed."""
        self.socket.close(0)
        if self._own_buffer is not None:
            self._own_buffer.close()  # a failed buffer writes nothing more (store.close)
