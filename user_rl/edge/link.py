"""The edge's data link to the learner: DEALER socket, hello, batches, heartbeats, acks.

Every batch goes to the disk spool first and leaves it only when the learner acknowledges it
as durable (acks are cumulative per stream epoch). At most `max_in_flight` batches are on the
wire unacknowledged; the rest wait in the spool, so a learner outage costs disk, not RAM, and
the control loop never blocks. With no ack progress for `resend_after_s` (a lost message, a
dropped connection, a restarted learner), the link sends again from the first unacked batch;
the learner drops duplicates. Batches spooled by an earlier run of this daemon (another
epoch) are sent too: the hello names those epochs (`spooled_epochs`), so a learner that never
heard of a life that started and died while it was down still takes them, and each ends with an
`edge_restart` marker this life writes after its last batch (`end_dead_lives`), so the learner
cuts the episode that life died in only once all of its data arrived. Unacked data is
never deleted because the learner does not know it: the link introduces itself again.

A batch the spool cannot read back is sent as an explicit gap (`lost`, no frames): the
learner records it, acks it, and the stream moves past it; both sides count it. A batch the
learner refuses for its content (a NaN, a wrong shape) comes back in an ack as refused, with
the reason: the learner keeps it in its quarantine and takes its seq, so it is never sent again
and the stream goes on (the cumulative ack drops it from the spool like any other).

When the TCP connection drops (a restarted learner, a broken uplink), the link stops sending
batches and introduces itself again as soon as it reconnects, so a new learner hears a hello
first instead of rejecting a window of batches from a robot it does not know yet. When the
connection stays up but the learner says nothing for `ack_timeout_s` while batches or a hello
wait for an answer, the link drops that connection and opens a new one (a new routing id,
which ZeroMQ assigns: the link never chooses one, so no other peer can take it over).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from user_rl.edge.epochs import next_epoch
from user_rl.edge.spool import Spool, SpoolCorrupt
from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.security.curve import ClientKeys
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import WireError, decode, encode, envelope
from user_rl.wire.images import ImageCompression, compress_columns
from user_rl.wire.spaces import box_to_proto, descriptor_to_proto, dict_space_to_proto
from user_rl.wire.transitions import EDGE_RESTART

log = logging.getLogger(__name__)

# A handshake the learner's gatekeeper denied is final: the link stops and says why.
KEY_REFUSED = (
    "key_refused: the learner does not accept this robot's key (not enrolled, or revoked): enrol it "
    "with `user-rl keys generate` or `user-rl keys enroll` on the learner's keys"
)
# Other failed handshakes look the same as a link that resets mid-handshake, so the link keeps
# trying; after this many in a row, never a success between, it reports the likely cause.
HANDSHAKE_STRIKES = 3
HANDSHAKE_FAILED = (
    "handshake_failed: the learner and this robot disagree on encryption: security.curve on both "
    "sides, and the learner's public key in keys_dir/learner.key (or the network resets "
    "connections; the link keeps trying)"
)
HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
# Older epochs announced in one hello; the rest follow once these have arrived.
MAX_ANNOUNCED_EPOCHS = 64
# send_multipart's flags, as plain ints once: pyzmq's sugar ORs enum members per frame otherwise,
# and a batch is two dozen frames.
_SEND_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_SEND_LAST = int(zmq.NOBLOCK)


def end_dead_lives(spool: Spool, robot_id: str, current: int) -> list[int]:
    """End every earlier life's spooled epoch with an `edge_restart` marker after its last batch.

    Every epoch in the spool at start-up (but `current`, this life's) belongs to a life of this edge
    that is over, and the spool holds the tail of its data. The marker takes the next seq, so the learner ends that
    epoch's open episode (the one the life died in) only after everything before it arrived:
    episodes completed in the spool stay complete. An epoch already ended (a life that died before
    its marker was acked) gets no second one. Returns the epochs ended now."""
    ended = []
    for epoch in spool.epochs():
        last = spool.last_pending(epoch)
        if epoch == current or last is None or _is_restart_marker(spool, epoch, last):
            continue
        body = pb.TransitionBatch(
            stream_epoch=epoch, seq=last + 1, count=0, send_time=time.time(), end_reason=EDGE_RESTART
        )
        if spool.put(epoch, last + 1, encode(envelope(robot_id, batch=body)), reserve=True):
            ended.append(epoch)
    if ended:
        log.info("%s: ended %d earlier lives' epochs after their spooled data", robot_id, len(ended))
    return ended


def _is_restart_marker(spool: Spool, epoch: int, seq: int) -> bool:
    try:
        msg = decode(spool.load(epoch, seq))
    except (WireError, SpoolCorrupt, KeyError, OSError):
        return False
    return msg.kind == "batch" and msg.body.count == 0 and msg.body.end_reason == EDGE_RESTART


@dataclass
class LinkSettings:
    spool_dir: str | None = None  # None: a fresh temporary directory (sims)
    spool_max_bytes: int = 2 * 2**30
    spool_fsync: bool = False  # fsync every spooled batch (real robots: it survives a power cut)
    max_in_flight: int = 64
    resend_after_s: float = 2.0
    ack_timeout_s: float = 10.0  # connected, answers awaited, not a word from the learner: reconnect
    # Batches spooled on a live link and not sent yet (the window is full) are also kept in RAM, up
    # to this many bytes, so they go out without being read back from the spool (see `_unsent`).
    unsent_ram_bytes: int = 64 << 20
    compression: dict[str, ImageCompression] | None = None
    curve: ClientKeys | None = None  # CurveZMQ keys; None: the link runs in the clear


@dataclass
class _Cursor:
    """Where one stream epoch stands: acked (durable) and sent."""

    acked: int = 0
    sent: int = 0
    progress_at: float = 0.0


class DataLink:
    def __init__(
        self,
        context: zmq.Context,
        address: str,
        descriptor: DeviceDescriptor,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        epoch: int | None = None,
        settings: LinkSettings | None = None,
    ) -> None:
        self.robot_id = descriptor.id
        self.settings = s = settings or LinkSettings()
        spool_dir = Path(s.spool_dir) if s.spool_dir else None
        self.spool = Spool(
            spool_dir or tempfile.mkdtemp(prefix=f"user-rl-spool-{self.robot_id}-"),
            s.spool_max_bytes,
            fsync=s.spool_fsync,
        )
        self.epoch = epoch if epoch is not None else next_epoch(spool_dir, self.robot_id, self.spool.epochs())
        self._context, self._address = context, address
        self.reconnects = 0
        self._failed_handshakes = 0
        self.handshake_error: str | None = None  # set while handshakes keep failing (not a refusal)
        self._open_socket()
        self._hello = pb.Hello(
            descriptor=descriptor_to_proto(descriptor),
            observation_space=dict_space_to_proto(obs_space),
            action_space=box_to_proto(action_space),
            stream_epoch=self.epoch,
        )
        self.cursors: dict[int, _Cursor] = {}
        end_dead_lives(self.spool, self.robot_id, self.epoch)
        for old_epoch in self.spool.epochs():  # left by an earlier run of this daemon
            first = self.spool.first_pending(old_epoch)
            self.cursors[old_epoch] = _Cursor(acked=first - 1, sent=first - 1)
        self.cursors[self.epoch] = _Cursor(progress_at=time.monotonic())
        self.seq = 0
        # This epoch's spooled batches not yet sent, by seq, as the frames `send_batch` encoded (the
        # spool holds each too): sending them from here saves reading each file back and checking its
        # crc. Only while welcomed (a batch spooled during an outage waits on disk, not in RAM), at
        # most `unsent_ram_bytes`; emptied when the link introduces itself again (a resend reads the
        # spool).
        self._unsent: OrderedDict[int, list] = OrderedDict()
        self._unsent_bytes = 0
        self.compression = dict(s.compression or {})
        self.dropped_transitions = 0
        self.step_credit = 0
        self.learner_version = -1
        self.welcomed = False
        self.stop_requested = False
        self.rejects: Counter[str] = Counter()
        self.last_reject: str | None = None  # the newest reason the learner gave for refusing a message
        self.resends = 0
        self.refused_batches = 0  # batches the learner refused for their content (it quarantines them)
        self._hello_at = 0.0
        self.refused: str | None = None  # the learner will not take this robot (e.g. other spaces)

    def _open_socket(self) -> None:
        """A fresh DEALER to the learner; ZeroMQ picks its routing id (a peer cannot claim it)."""
        s = self.settings
        self.socket = self._context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.IMMEDIATE, 1)  # no queueing into a dead connection: the spool holds it
        self.socket.setsockopt(zmq.SNDHWM, 4 * s.max_in_flight)
        self._connection_events = self.socket.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | HANDSHAKE_EVENTS
        )
        self._connected = False
        self._heard_at = time.monotonic()  # the last message from the learner (or when none was awaited)
        if s.curve is not None:
            s.curve.apply(self.socket)
        self.socket.connect(self._address)

    def _close_socket(self) -> None:
        self.socket.disable_monitor()
        self._connection_events.close(0)
        self.socket.close(0)

    def _reconnect(self) -> None:
        """The learner went silent on a live connection: drop it and start over on a new one."""
        log.warning(
            "%s: no reply from the learner for %.1f s with %d batches waiting: reconnecting",
            self.robot_id,
            self.settings.ack_timeout_s,
            self.unacked,
        )
        self._close_socket()
        self._open_socket()
        self.reconnects += 1
        self._reintroduce()

    @property
    def connected(self) -> bool:
        """Whether the TCP connection to the learner is up (as of the last `poll`)."""
        return self._connected

    @property
    def lost_batches(self) -> int:
        """Batches the spool could not read back, sent to the learner as explicit gaps."""
        return self.spool.lost_batches

    @property
    def unacked(self) -> int:
        """Batches spooled and not yet acknowledged (the backlog)."""
        return len(self.spool)

    def hello(self, policy_version: int = -1) -> None:
        """Introduce this robot; until the learner answers, `pump` repeats it (at once if not yet connected)."""
        self._hello.policy_version = policy_version
        del self._hello.spooled_epochs[:]
        self._hello.spooled_epochs.extend(self._announced())
        self._hello.more_spooled_epochs = len(self.cursors) - 1 > len(self._hello.spooled_epochs)
        if self._send(encode(envelope(self.robot_id, hello=self._hello))):
            self._hello_at = time.monotonic()

    def _announced(self) -> list[int]:
        """The older epochs whose spooled batches this link sends now (named in the hello)."""
        return sorted(e for e in self.cursors if e != self.epoch)[:MAX_ANNOUNCED_EPOCHS]

    def send_batch(self, count: int, columns: dict[str, np.ndarray], people: Sequence[str] = ()) -> int | None:
        """Spool a batch and send it when the window allows; None if the spool is full (dropped).
        `people`: the names its person columns refer to (`BatchBuilder.take_batch`).

        The columns may be sent from memory, without a copy, after this returns: the caller hands
        them over and does not change them (`BatchBuilder.take_batch` makes fresh ones)."""
        if self.compression:
            columns = compress_columns(columns, self.compression)
        seq = self.seq + 1
        body = pb.TransitionBatch(
            stream_epoch=self.epoch, seq=seq, count=count, send_time=time.time(), people=list(people)
        )
        frames = encode(envelope(self.robot_id, batch=body), columns)
        if not self.spool.put(self.epoch, seq, frames):
            self.dropped_transitions += count
            return None
        self.seq = seq
        self._keep_unsent(seq, frames)
        self.pump()
        return seq

    def _keep_unsent(self, seq: int, frames: list) -> None:
        """Hold a just-spooled batch's frames for `pump`, if the link is live and RAM allows."""
        if not self.welcomed or self.refused is not None:
            return
        size = sum(memoryview(f).nbytes for f in frames)
        if self._unsent_bytes + size <= self.settings.unsent_ram_bytes:
            self._unsent[seq] = frames
            self._unsent_bytes += size

    def _take_unsent(self, seq: int) -> list | None:
        """The frames of this epoch's batch `seq` if RAM holds them (they leave RAM)."""
        frames = self._unsent.pop(seq, None)
        if frames is not None:
            self._unsent_bytes -= sum(memoryview(f).nbytes for f in frames)
        return frames

    def _put_back_unsent(self, seq: int, frames: list) -> None:
        """A batch taken from RAM that could not be sent (the queue was full) waits there again."""
        self._unsent[seq] = frames
        self._unsent.move_to_end(seq, last=False)
        self._unsent_bytes += sum(memoryview(f).nbytes for f in frames)

    def _drop_unsent(self, through: int | None = None) -> None:
        """Forget the RAM copies (of seqs up to `through`; all by default): the spool has them."""
        if through is None:
            self._unsent.clear()
            self._unsent_bytes = 0
            return
        while self._unsent and next(iter(self._unsent)) <= through:
            self._take_unsent(next(iter(self._unsent)))

    def send_episode_end(self, reason: str) -> int | None:
        """Spool and send a count-0 batch that ends the stream's open episode here (the learner stores
        it as truncated with `reason`, e.g. "estop"); in order with the batches, durable like one."""
        seq = self.seq + 1
        body = pb.TransitionBatch(stream_epoch=self.epoch, seq=seq, count=0, send_time=time.time(), end_reason=reason)
        if not self.spool.put(self.epoch, seq, encode(envelope(self.robot_id, batch=body))):
            log.error("%s: spool full: the end of an episode (%s) was not recorded", self.robot_id, reason)
            return None
        self.seq = seq
        self.pump()
        return seq

    def pump(self) -> None:
        """Send spooled batches while fewer than `max_in_flight` are unacknowledged."""
        now = time.monotonic()
        if not self.welcomed:  # batches wait until the learner has answered our hello
            if now - self._hello_at > 0.5 and self.refused is None:
                self.hello(self._hello.policy_version)
            return
        announced = set(self._hello.spooled_epochs)
        for epoch, cursor in list(self.cursors.items()):
            if epoch != self.epoch and epoch not in announced:
                continue  # the learner opens an older epoch's stream only once a hello named it
            if cursor.sent > cursor.acked and now - cursor.progress_at > self.settings.resend_after_s:
                cursor.sent = cursor.acked  # no progress: go back and send again from the first unacked
                cursor.progress_at = now
                self.resends += 1
            last = self.seq if epoch == self.epoch else self.spool.last_pending(epoch)
            while cursor.sent < (last or 0) and cursor.sent - cursor.acked < self.settings.max_in_flight:
                seq = cursor.sent + 1
                frames = self._take_unsent(seq) if epoch == self.epoch else None
                from_ram = frames is not None
                if frames is None:
                    frames = self.spool.load_or_lost(epoch, seq)
                if frames is None:  # unreadable: tell the learner it is lost, so the stream moves on
                    frames = encode(
                        envelope(
                            self.robot_id,
                            batch=pb.TransitionBatch(
                                stream_epoch=epoch, seq=seq, count=0, lost=True, send_time=time.time()
                            ),
                        )
                    )
                if not self._send(frames):
                    if from_ram:
                        self._put_back_unsent(seq, frames)
                    return  # no connection: keep it spooled, try again later
                if cursor.sent == cursor.acked:
                    cursor.progress_at = now
                cursor.sent = seq

    def heartbeat(self, report: pb.Heartbeat) -> None:
        """Send the edge's report of itself (`EdgeDaemon.report`), stamped now; only once welcomed
        (before, the learner would reject it as no_hello)."""
        if not self.welcomed:
            return
        report.time = time.time()
        self._send(encode(envelope(self.robot_id, heartbeat=report)))

    def leave(self, timeout_s: float = 5.0) -> bool:
        """Tell the learner this robot is detaching; True once it answered (call after everything is acked)."""
        hb = pb.Heartbeat(time=time.time(), unacked_batches=self.unacked, leaving=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._send(encode(envelope(self.robot_id, heartbeat=hb))):
                if self.socket.poll(int(1000 * max(0.0, deadline - time.monotonic()))):
                    return self.poll(0) > 0
            time.sleep(0.05)
        return False

    def _send(self, frames: list) -> bool:
        """`send_multipart(frames, NOBLOCK, copy=False)`, frame by frame with int flags (see
        _SEND_MORE). Only the first frame can meet a full queue: ZeroMQ queues a message whole."""
        send = self.socket.send
        try:
            for frame in frames[:-1]:
                send(frame, _SEND_MORE, copy=False)
            send(frames[-1], _SEND_LAST, copy=False)
            return True
        except zmq.Again:
            return False

    def poll(self, timeout_ms: int = 0) -> int:
        """Handle replies from the learner (acks, credit, rejects, commands), then send what is due."""
        self._check_connection()
        handled = 0
        while self.socket.poll(timeout_ms if handled == 0 else 0):
            handled += 1
            self._heard_at = time.monotonic()
            try:
                msg = decode(self.socket.recv_multipart(copy=False))
            except WireError as exc:
                self.rejects[exc.reason] += 1
                log.warning("%s: undecodable reply from learner: %s", self.robot_id, exc)
                continue
            if msg.kind == "ack":
                self._on_ack(msg.body)
            elif msg.kind == "reject":
                self._on_reject(msg.body.reason)
            elif msg.kind == "command" and msg.body.kind == pb.Command.KIND_STOP:
                self.stop_requested = True
        self._check_silence()
        self.pump()
        return handled

    def _check_silence(self) -> None:
        """Reconnect when answers are awaited on a live connection and none came for `ack_timeout_s`
        (a learner that lost track of this connection, a half-open TCP link)."""
        now = time.monotonic()
        if self.refused is not None or (self.welcomed and not self.unacked):
            self._heard_at = now  # nothing awaited: silence means nothing
        elif self._connected and now - self._heard_at > self.settings.ack_timeout_s:
            self._reconnect()

    def _check_connection(self) -> None:
        """After a disconnect, hold batches until the learner (perhaps a new one) welcomes us again."""
        while self._connection_events.poll(0):
            event = recv_monitor_message(self._connection_events)["event"]
            if event == zmq.EVENT_CONNECTED:
                self._connected, self._heard_at = True, time.monotonic()
            elif event == zmq.EVENT_DISCONNECTED:
                self._connected = False
                self._reintroduce()
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._failed_handshakes, self.handshake_error = 0, None
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH and self.refused is None:
                self.refused = KEY_REFUSED
                log.error("%s: %s", self.robot_id, self.refused)
            elif event & HANDSHAKE_EVENTS:
                self._failed_handshakes += 1
                # A protocol error (one side in the clear) is not retried by ZeroMQ: say so at once.
                if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL or self._failed_handshakes == HANDSHAKE_STRIKES:
                    self.handshake_error = HANDSHAKE_FAILED
                    log.error("%s: %s", self.robot_id, self.handshake_error)

    def _reintroduce(self) -> None:
        """Say hello again; everything not yet acknowledged is sent again once welcomed."""
        self.welcomed = False
        self._hello_at = 0.0  # `pump` repeats the hello until the connection is back
        self._drop_unsent()  # sent again from the spool once welcomed
        for cursor in self.cursors.values():
            cursor.sent = cursor.acked

    def _on_ack(self, ack: pb.Ack) -> None:
        if ack.refused_seq:
            self._on_refused_batch(ack)
        cursor = self.cursors.get(ack.stream_epoch)
        if cursor is None:
            return
        if ack.stream_epoch == self.epoch:
            self.welcomed = True
            self.step_credit = ack.step_credit
            self.learner_version = ack.policy_version
        if ack.seq > cursor.acked:
            self.spool.ack_through(ack.stream_epoch, ack.seq)
            if ack.stream_epoch == self.epoch:
                self._drop_unsent(ack.seq)
            cursor.acked = ack.seq
            cursor.progress_at = time.monotonic()
        cursor.sent = max(cursor.sent, cursor.acked)
        if ack.next_seq and ack.next_seq - 1 < cursor.acked:
            # The learner lacks batches this spool no longer holds (found missing at a restart):
            # go back, and `pump` tells it they are lost.
            cursor.acked = cursor.sent = ack.next_seq - 1
        elif ack.next_seq and ack.next_seq - 1 < cursor.sent:
            cursor.sent = ack.next_seq - 1  # the learner missed a batch: resume right after what it has
        if ack.stream_epoch != self.epoch and cursor.acked >= (self.spool.last_pending(ack.stream_epoch) or 0):
            del self.cursors[ack.stream_epoch]  # an earlier run's spool has fully arrived
            if len(self.cursors) > len(self._hello.spooled_epochs):  # more older epochs wait: name them
                self.hello(self._hello.policy_version)

    def _on_refused_batch(self, ack: pb.Ack) -> None:
        """The learner refused a batch for its content: sending it again cannot help, and need not (it
        took the seq): count it and say why; the stream goes on."""
        self.refused_batches += 1
        self.last_reject = (
            f"batch {ack.refused_seq} of epoch {ack.stream_epoch} refused and quarantined: {ack.refused_reason}"
        )
        log.warning("%s: %s", self.robot_id, self.last_reject)

    def _on_reject(self, reason: str) -> None:
        key = reason.split(":")[0]
        self.rejects[key] += 1
        self.last_reject = reason
        if key in ("no_hello", "unknown_stream"):
            # The learner restarted, or does not know this connection or an older epoch of ours:
            # introduce ourselves again (the hello names every spooled epoch). Nothing is deleted.
            self._reintroduce()  # `pump` says hello once, however many rejects came in
            return
        if key in ("spaces_mismatch", "bad_hello", "not_enrolled", "wrong_robot"):  # retrying cannot help
            if self.refused is None:
                log.error("%s: the learner refused this robot: %s", self.robot_id, reason)
            self.refused = reason
            return
        log.warning("%s: learner rejected a message: %s", self.robot_id, reason)

    def close(self) -> None:
        self._close_socket()
