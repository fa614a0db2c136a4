"""Live ingest on real ZeroMQ sockets: bad input is rejected with a counted reason and the
peer is told; the socket keeps serving real edges, whose batches are acked, stitched and
stored exactly once."""

from __future__ import annotations

import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import zmq

from tests.support import messages
from user_rl.cloud.ingest import Ingest
from user_rl.edge.batching import BatchBuilder
from user_rl.edge.link import DataLink
from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.testing.wait import serving
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import PROTOCOL_VERSION, Message, decode, encode, envelope

OBS_SPACE = gym.spaces.Dict(
    {
        "image": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
        "state": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    }
)
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
TIMEOUT = 5.0


def wait_until(
    condition: Callable[[], bool], timeout: float = TIMEOUT, pump: Callable[[], object] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        if pump is not None:
            pump()
        else:
            time.sleep(0.005)


class Episodes:
    """Feeds a BatchBuilder with a deterministic robot: episodes of `length` steps, truncated."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.episode = 0
        self.step = 0
        self.t = 0

    def obs(self) -> dict[str, np.ndarray]:
        v = (self.t % 100) / 100
        return {"image": np.full((4, 4, 3), self.t % 256, np.uint8), "state": np.full(3, v, np.float32)}

    def batch(self, rows: int) -> tuple[int, dict[str, np.ndarray]]:
        builder = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=rows)
        for _ in range(rows):
            obs = self.obs()
            self.t += 1
            ends = self.step == self.length - 1
            builder.add(
                obs,
                np.array([0.5, -0.5], np.float32),
                1.0,
                False,
                ends,
                episode=self.episode,
                step=self.step,
                policy_version=0,
                actor=pb.ACTOR_POLICY,
                label=pb.LABEL_NONE,
                sensor_time=time.time(),
                final_obs=self.obs() if ends else None,
            )
            self.step += 1
            if ends:
                self.episode, self.step = self.episode + 1, 0
        return builder.take()


def hello_envelope(robot_id: str, epoch: int, obs_space: gym.spaces.Dict = OBS_SPACE) -> pb.Envelope:
    return messages.hello_envelope(robot_id, epoch, obs_space, ACTION_SPACE)


def welcomed_link(context: zmq.Context, ingest: Ingest, robot_id: str, epoch: int) -> DataLink:
    """A real edge link to the ingest, introduced and welcomed."""
    link = DataLink(
        context, ingest.endpoint, DeviceDescriptor("sim", "test", robot_id), OBS_SPACE, ACTION_SPACE, epoch=epoch
    )
    link.hello()
    wait_until(lambda: link.welcomed, pump=lambda: link.poll(20))
    return link


class RawPeer:
    """A bare DEALER: sends exactly the frames it is given."""

    def __init__(self, context: zmq.Context, address: str) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)

    def send(self, frames) -> None:
        self.socket.send_multipart(list(frames))

    def reply(self) -> Message:
        assert self.socket.poll(int(TIMEOUT * 1000)), "no reply from the ingest"
        return decode(self.socket.recv_multipart())

    def ack_where(self, condition: Callable[[pb.Ack], bool]) -> pb.Ack:
        """The first ack that meets `condition` (the group commit's cumulative acks come in between)."""
        while True:
            msg = self.reply()
            assert msg.kind == "ack", (msg.kind, msg.envelope)
            if condition(msg.body):
                return msg.body

    def expect_reject(self, reason: str) -> str:
        msg = self.reply()
        assert msg.kind == "reject", msg.kind
        assert msg.body.reason.split(":")[0] == reason, msg.body.reason
        return msg.body.reason

    def close(self) -> None:
        self.socket.close(0)


def test_bad_input_is_rejected_and_ingest_keeps_serving(context: zmq.Context, ingest: Ingest) -> None:
    peer = RawPeer(context, ingest.endpoint)
    try:

        def rejected_once(reason: str) -> None:
            peer.expect_reject(reason)
            assert ingest.rejected[reason] == 1, dict(ingest.rejected)

        peer.send([b"\xff\xfe not a protobuf \x00"])
        rejected_once("undecodable")

        peer.send([b""])  # an empty frame is an envelope of protocol 0
        peer.expect_reject("wrong_version")

        env = hello_envelope("raw-0", epoch=1)
        env.protocol_version = PROTOCOL_VERSION + 1
        peer.send([env.SerializeToString()])
        peer.expect_reject("wrong_version")
        assert ingest.rejected["wrong_version"] == 2

        count, cols = Episodes(50).batch(8)
        batch = encode(envelope("raw-0", batch=pb.TransitionBatch(stream_epoch=1, seq=1, count=count)), cols)
        frames = [bytes(f) for f in batch]
        peer.send(frames[:-1])  # truncated: the last frame is missing
        rejected_once("frame_count")
        cut = list(frames)
        cut[3] = cut[3][: len(cut[3]) // 2]  # truncated frame
        peer.send(cut)
        rejected_once("frame_size")

        peer.send(frames)  # a valid batch, but no hello yet
        rejected_once("no_hello")
        assert ingest.buffer is None  # nothing was stored, no fleet spaces were guessed

        peer.send(encode(hello_envelope("raw-0", epoch=1)))
        welcome = peer.reply()
        assert welcome.kind == "ack" and welcome.body.seq == 0 and welcome.body.stream_epoch == 1

        def refused_once(seq: int, reason: str) -> None:
            # A batch next in its stream whose content cannot be used: quarantined, its seq taken.
            ack = peer.ack_where(lambda a: a.refused_seq != 0)
            assert ack.refused_seq == seq and ack.refused_reason.split(":")[0] == reason, ack
            assert ingest.rejected[reason] == 1, dict(ingest.rejected)

        bad = dict(cols)
        bad["obs/state"] = np.zeros((count, 4), np.float32)
        peer.send(encode(envelope("raw-0", batch=pb.TransitionBatch(stream_epoch=1, seq=1, count=count)), bad))
        refused_once(1, "bad_shape")

        nan = {k: v.copy() for k, v in cols.items()}
        nan["action"][3, 0] = np.nan
        peer.send(encode(envelope("raw-0", batch=pb.TransitionBatch(stream_epoch=1, seq=2, count=count)), nan))
        refused_once(2, "non_finite")

        peer.ack_where(lambda a: a.seq == 2 and not a.refused_seq)  # the refusals are durable, and acked
        peer.send(encode(envelope("raw-0", batch=pb.TransitionBatch(stream_epoch=2, seq=1, count=count)), cols))
        rejected_once("unknown_stream")

        peer.send(encode(envelope("raw-0", weights_request=pb.WeightsRequest(have_version=-1))))
        rejected_once("unexpected")

        # None of it was stored; the stream moved past the two refused batches.
        assert len(ingest.buffer) == 0
        assert ingest.robots["raw-0"].stream.record.last_seq == 2 and ingest.robots["raw-0"].transitions == 0
        assert ingest.robots["raw-0"].quarantined_batches == 2

        # The same peer's valid batch after all that is accepted.
        batch = encode(envelope("raw-0", batch=pb.TransitionBatch(stream_epoch=1, seq=3, count=count)), cols)
        peer.send(batch)
        assert peer.ack_where(lambda a: a.seq == 3).refused_seq == 0
        assert len(ingest.buffer) == 7  # 8 rows, the last waits for its successor

        # Then a real edge client talks to the same ingest.
        link = welcomed_link(context, ingest, "edge-0", epoch=42)
        try:
            robot = Episodes(25)
            for _ in range(3):
                link.send_batch(*robot.batch(10))
            assert link.unacked == 3  # spooled until acked as durable
            wait_until(lambda: not link.unacked, pump=lambda: link.poll(20))
            # Rows 0..23 pair with their successor, row 24 with its final obs, 25..28 with the
            # next; row 29 waits for the next batch.
            assert len(ingest.buffer) == 7 + 29
            session = ingest.robots["edge-0"]
            assert session.transitions == 30 and session.episodes == 1 and session.stream.durable_seq == 3
            assert link.rejects == {}
        finally:
            link.close()
        assert sum(ingest.rejected.values()) == 10
    finally:
        peer.close()


def test_duplicate_batch_is_acked_but_stored_once(context: zmq.Context, ingest: Ingest) -> None:
    link = welcomed_link(context, ingest, "edge-1", epoch=7)
    try:
        robot = Episodes(100)
        link.send_batch(*robot.batch(10))
        seq = link.send_batch(*robot.batch(10))
        frames = link.spool.load(link.epoch, seq)
        wait_until(lambda: not link.unacked, pump=lambda: link.poll(20))
        stored = len(ingest.buffer)
        assert stored == 19 and ingest.duplicates == 0

        # The edge did not see the ack (say, a reconnect) and sends the same batch again.
        link.socket.send_multipart(frames, copy=False)
        wait_until(lambda: ingest.duplicates == 1, pump=lambda: link.poll(20))  # acked again
        assert len(ingest.buffer) == stored
        assert ingest.robots["edge-1"].transitions == 20  # counted once too

        # An older batch still counts as a duplicate; the stream carries on afterwards.
        link.socket.send_multipart(frames, copy=False)
        link.send_batch(*robot.batch(10))
        wait_until(lambda: not link.unacked and ingest.duplicates == 2, pump=lambda: link.poll(20))
        assert len(ingest.buffer) == stored + 10
        assert sum(ingest.rejected.values()) == 0
    finally:
        link.close()


def test_the_buffer_keeps_each_robots_control_rate_for_its_exports(context: zmq.Context, ingest: Ingest) -> None:
    """The rate a robot's hello declares is what a dataset export's fps will be (datasets/lerobot.py)."""
    descriptor = DeviceDescriptor("sim", "test", "edge-hz", control_hz=25.0)
    link = DataLink(context, ingest.endpoint, descriptor, OBS_SPACE, ACTION_SPACE, epoch=1)
    try:
        link.hello()
        wait_until(lambda: link.welcomed, pump=lambda: link.poll(20))
        link.send_batch(*Episodes(100).batch(5))
        wait_until(lambda: not link.unacked, pump=lambda: link.poll(20))
        assert ingest.buffer.control_rates() == {"edge-hz": 25.0}
    finally:
        link.close()


def test_hello_with_other_spaces_is_rejected(context: zmq.Context, ingest: Ingest) -> None:
    first = DataLink(
        context, ingest.endpoint, DeviceDescriptor("sim", "test", "edge-a"), OBS_SPACE, ACTION_SPACE, epoch=1
    )
    other_obs = gym.spaces.Dict(
        {
            "image": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
            "state": gym.spaces.Box(-1.0, 1.0, (5,), np.float32),
        }
    )
    odd = DataLink(
        context, ingest.endpoint, DeviceDescriptor("sim", "test", "edge-b"), other_obs, ACTION_SPACE, epoch=1
    )
    try:
        first.hello()
        wait_until(lambda: first.welcomed, pump=lambda: first.poll(20))
        odd.hello()
        wait_until(lambda: odd.rejects["spaces_mismatch"] == 1, pump=lambda: odd.poll(20))
        assert not odd.welcomed
        assert ingest.rejected["spaces_mismatch"] == 1
        assert "edge-b" not in ingest.robots
        assert ingest.obs_space == OBS_SPACE  # the fleet's spaces did not change

        # The odd robot's link knows it was refused: it stops asking and sends no batches.
        assert odd.refused is not None and "spaces differ" in odd.refused
        odd_builder = BatchBuilder(other_obs, ACTION_SPACE, capacity=2)
        for step in range(2):
            odd_builder.add(
                {"image": np.zeros((4, 4, 3), np.uint8), "state": np.zeros(5, np.float32)},
                np.zeros(2, np.float32),
                0.0,
                False,
                False,
                episode=0,
                step=step,
                policy_version=0,
                actor=0,
                label=0,
                sensor_time=0.0,
            )
        odd.send_batch(*odd_builder.take())
        for _ in range(30):
            odd.poll(20)
        assert odd.rejects["spaces_mismatch"] == 1 and ingest.rejected["spaces_mismatch"] == 1
        assert odd.unacked == 1  # kept in its spool, never sent to a learner that refused it

        first.send_batch(*Episodes(50).batch(5))
        wait_until(lambda: not first.unacked, pump=lambda: first.poll(20))
        assert len(ingest.buffer) == 4
    finally:
        first.close()
        odd.close()


def test_malformed_hello_is_rejected_not_crashing(context: zmq.Context, ingest: Ingest) -> None:
    peer = RawPeer(context, ingest.endpoint)
    try:
        env = hello_envelope("raw-1", epoch=1)
        env.hello.observation_space["state"].dtype = "not_a_dtype"
        peer.send(encode(env))
        peer.expect_reject("bad_hello")
        env = hello_envelope("raw-1", epoch=1)
        del env.hello.observation_space["state"].low[:]
        env.hello.observation_space["state"].low.extend([0.0, 1.0])  # two bounds for three elements
        peer.send(encode(env))
        peer.expect_reject("bad_hello")
        env = hello_envelope("", epoch=1)  # no robot id
        peer.send(encode(env))
        peer.expect_reject("bad_hello")
        assert ingest.buffer is None and ingest.robots == {}
        # Still serving: a proper hello is welcomed.
        peer.send(encode(hello_envelope("raw-1", epoch=1)))
        assert peer.reply().kind == "ack"
    finally:
        peer.close()


def test_heartbeat_is_answered(context: zmq.Context, ingest: Ingest) -> None:
    peer = RawPeer(context, ingest.endpoint)
    link = None
    try:
        # A heartbeat from a robot that never said hello is refused with a reason.
        peer.send(encode(envelope("edge-h", heartbeat=pb.Heartbeat(env_steps=5))))
        peer.expect_reject("no_hello")
        # A real link holds its heartbeats until it is welcomed: a hello sent while TCP still
        # connects is dropped, and a heartbeat overtaking its retry must not be rejected.
        link = DataLink(
            context, ingest.endpoint, DeviceDescriptor("sim", "test", "edge-h"), OBS_SPACE, ACTION_SPACE, epoch=3
        )
        for _ in range(20):  # connected, not yet introduced
            link.heartbeat(pb.Heartbeat(env_steps=5))
            link.socket.poll(10)
        assert ingest.rejected["no_hello"] == 1 and not link.rejects
        link.hello()
        wait_until(lambda: link.welcomed, pump=lambda: link.poll(20))
        link.heartbeat(pb.Heartbeat(env_steps=123, steps_per_second=50.0))
        wait_until(lambda: ingest.robots["edge-h"].summary()["edge_steps"] == 123)
        assert ingest.rejected["no_hello"] == 1 and link.rejects["no_hello"] == 0
    finally:
        if link is not None:
            link.close()
        peer.close()


def test_restarted_edge_starts_a_new_stream(context: zmq.Context, ingest: Ingest) -> None:
    robot = Episodes(100)
    old = DataLink(
        context, ingest.endpoint, DeviceDescriptor("sim", "test", "edge-r"), OBS_SPACE, ACTION_SPACE, epoch=1
    )
    try:
        old.hello()
        wait_until(lambda: old.welcomed, pump=lambda: old.poll(20))
        old.send_batch(*robot.batch(10))
        old.send_batch(*robot.batch(10))
        wait_until(lambda: not old.unacked, pump=lambda: old.poll(20))
        assert len(ingest.buffer) == 19
    finally:
        old.close()
    new = DataLink(
        context, ingest.endpoint, DeviceDescriptor("sim", "test", "edge-r"), OBS_SPACE, ACTION_SPACE, epoch=2
    )
    try:
        new.hello()
        wait_until(lambda: new.welcomed, pump=lambda: new.poll(20))
        assert new.send_batch(*robot.batch(10)) == 1  # seq starts again at 1: not a duplicate
        wait_until(lambda: not new.unacked, pump=lambda: new.poll(20))
        assert ingest.duplicates == 0
        # The old stream's pending record is not paired with the new stream's first row.
        assert len(ingest.buffer) == 19 + 9
        session = ingest.robots["edge-r"]
        assert session.epoch == 2 and session.transitions == 30 and session.index == 0
    finally:
        new.close()


def test_ids_too_big_for_the_index_are_rejected_and_commits_go_on(context: zmq.Context, ingest: Ingest) -> None:
    """Found by the fuzz test: a stream epoch or an episode number of 2**63 or more (both uint64 on
    the wire) would reach the SQLite index at the next commit and crash the ingest there."""
    peer = RawPeer(context, ingest.endpoint)
    try:
        peer.send(encode(hello_envelope("big-0", epoch=2**64 - 1)))
        assert "above 2**63 - 1" in peer.expect_reject("bad_hello")
        peer.send(encode(hello_envelope("big-0", epoch=5)))
        assert peer.reply().kind == "ack"
        count, cols = Episodes(50).batch(8)
        huge = {k: v.copy() for k, v in cols.items()}
        huge["episode"][:] = 2**63
        peer.send(encode(envelope("big-0", batch=pb.TransitionBatch(stream_epoch=5, seq=1, count=count)), huge))
        assert peer.ack_where(lambda a: a.refused_seq == 1).refused_reason.startswith("bad_episode")
        peer.send(encode(envelope("big-0", batch=pb.TransitionBatch(stream_epoch=5, seq=2, count=count)), cols))
        peer.ack_where(lambda a: a.seq == 2)  # committed: the index took everything it was given
    finally:
        peer.close()


def test_the_status_shows_each_robots_own_step_count_and_what_is_stored(context: zmq.Context, ingest: Ingest) -> None:
    """A killed edge's exact step count is recoverable from the learner's status: the edge's own
    count from its last heartbeat, beside the transitions stored and the acked batches."""
    link = welcomed_link(context, ingest, "edge-s", epoch=11)
    try:
        robot = Episodes(100)
        link.send_batch(*robot.batch(10))
        link.send_batch(*robot.batch(7))
        wait_until(lambda: not link.unacked, pump=lambda: link.poll(20))
        # (The summary as the status shows it; read here beside the ingest's serving thread.)
        assert ingest.robots["edge-s"].summary()["edge_steps"] is None  # no heartbeat yet
        link.heartbeat(pb.Heartbeat(env_steps=21))  # four steps taken since the last batch, not yet sent
        wait_until(lambda: ingest.robots["edge-s"].summary()["edge_steps"] == 21)
        summary = ingest.robots["edge-s"].summary()
        assert summary["transitions"] == 17 and summary["acked_seq"] == 2 and summary["stream_epoch"] == 11
    finally:
        link.close()


# -- issue 10: markers, per-stream credit, spooled epochs, connections ---------------------------------
def hello_ack(peer: RawPeer, robot_id: str, epoch: int, spooled: tuple[int, ...] = ()) -> list[Message]:
    """Say hello (naming spooled epochs); the acks that answer it: one per named epoch the learner
    holds data of, then the current epoch's."""
    env = hello_envelope(robot_id, epoch)
    env.hello.spooled_epochs.extend(spooled)
    peer.send(encode(env))
    replies = [peer.reply()]
    while replies[-1].kind == "ack" and replies[-1].body.stream_epoch != epoch:
        replies.append(peer.reply())
    assert all(r.kind == "ack" for r in replies), [r.kind for r in replies]
    return replies


def send_batch(
    peer: RawPeer, robot_id: str, epoch: int, seq: int, rows: tuple[int, dict] | None = None, **marker
) -> Message:
    """One batch (or a marker with no rows); waits for its ack."""
    body = pb.TransitionBatch(stream_epoch=epoch, seq=seq, count=rows[0] if rows else 0, **marker)
    peer.send(encode(envelope(robot_id, batch=body), rows[1] if rows else None))
    ack = peer.reply()
    assert ack.kind == "ack" and ack.body.stream_epoch == epoch, ack
    while ack.body.seq < seq:  # acks come once a commit made the batch durable
        ack = peer.reply()
    return ack


def test_a_lost_batch_is_an_explicit_counted_gap_the_stream_moves_past(context: zmq.Context, ingest: Ingest) -> None:
    peer = RawPeer(context, ingest.endpoint)
    robot = Episodes(100)
    try:
        hello_ack(peer, "gap-0", epoch=1)
        send_batch(peer, "gap-0", 1, 1, robot.batch(8))
        robot.batch(8)  # what seq 2 held: the edge could not read it back
        assert send_batch(peer, "gap-0", 1, 2, lost=True).body.seq == 2  # acked like a stored batch
        assert send_batch(peer, "gap-0", 1, 3, robot.batch(8)).body.seq == 3
        # Rows 0..6 pair; row 7 has no successor (seq 2 is lost); 8..14 pair, 15 waits.
        assert len(ingest.buffer) == 7 + 7
        assert ingest.lost_batches == 1 and ingest.report()["robots"]["gap-0"]["lost_batches"] == 1
        assert ingest.robots["gap-0"].transitions == 16
        # A lost marker again (a resend) is a duplicate, not a second loss.
        assert send_batch(peer, "gap-0", 1, 2, lost=True).body.seq == 3 and ingest.lost_batches == 1
        # A marker that carries steps is refused, and the stream is not advanced by it.
        count, cols = robot.batch(4)
        peer.send(
            encode(envelope("gap-0", batch=pb.TransitionBatch(stream_epoch=1, seq=4, count=count, lost=True)), cols)
        )
        peer.expect_reject("bad_marker")
        assert ingest.robots["gap-0"].stream.record.last_seq == 3
    finally:
        peer.close()
    ingest.maybe_commit(force=True)
    assert ("gap-0", 1, 2) in ingest.buffer.lost_keys()  # the gap is recorded, durably


def test_an_episode_end_marker_truncates_the_open_episode_with_its_reason(context: zmq.Context, ingest: Ingest) -> None:
    peer = RawPeer(context, ingest.endpoint)
    robot = Episodes(100)
    try:
        hello_ack(peer, "stop-0", epoch=1)
        send_batch(peer, "stop-0", 1, 1, robot.batch(8))  # episode 0, open
        assert send_batch(peer, "stop-0", 1, 2, end_reason="estop").body.seq == 2
        robot.episode, robot.step = 1, 0  # after re-arm the edge starts a new episode
        send_batch(peer, "stop-0", 1, 3, robot.batch(8))
        stream = ingest.robots["stop-0"].stream
        # The last step before the stop pairs with nothing after it: 7 + 7 transitions.
        assert len(ingest.buffer) == 14
        assert ingest.lost_batches == 0 and ingest.episode_ends == 1
        send_batch(peer, "stop-0", 1, 4, end_reason="hold")
    finally:
        peer.close()
    episodes = {e.episode: e for e in ingest.buffer.index.episodes() if e.stream == stream.record.id}
    assert (episodes[0].status, episodes[0].end_reason, episodes[0].length) == ("truncated", "estop", 8)
    assert (episodes[1].status, episodes[1].end_reason, episodes[1].length) == ("truncated", "hold", 8)


def test_step_credit_is_per_stream_what_is_stored_plus_the_increment(context: zmq.Context, ingest: Ingest) -> None:
    peer = RawPeer(context, ingest.endpoint)
    robot = Episodes(100)
    try:
        assert hello_ack(peer, "paced-0", epoch=1)[-1].body.step_credit == 0  # not paced (yet): no limit
        ingest.credit.increment = 100
        assert send_batch(peer, "paced-0", 1, 1, robot.batch(8)).body.step_credit == 108
        assert send_batch(peer, "paced-0", 1, 2, robot.batch(5)).body.step_credit == 113
        # A new life of the edge counts from its own stream: its steps since its start.
        assert hello_ack(peer, "paced-0", epoch=2)[-1].body.step_credit == 100
        ingest.credit.increment = None  # unpaced
        assert send_batch(peer, "paced-0", 2, 1, robot.batch(4)).body.step_credit == 0
    finally:
        peer.close()


def test_step_credit_counts_what_was_stored_before_a_learner_restart(context: zmq.Context, tmp_path) -> None:
    robot = Episodes(100)
    for life in range(2):
        ing = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer")
        ing.credit.increment = 50
        with serving(lambda: ing.poll(50)):
            peer = RawPeer(context, ing.endpoint)
            try:
                welcome = hello_ack(peer, "paced-1", epoch=9)[-1].body
                assert welcome.step_credit == 50 + 16 * life and welcome.seq == 2 * life
                for seq in (2 * life + 1, 2 * life + 2):
                    send_batch(peer, "paced-1", 9, seq, robot.batch(8))
            finally:
                peer.close()
        ing.close()


def test_spooled_epochs_named_in_the_hello_are_opened_and_take_batches(context: zmq.Context, ingest: Ingest) -> None:
    """An edge life that started and died while the learner was down: its epoch arrives by name."""
    peer = RawPeer(context, ingest.endpoint)
    robot = Episodes(100)
    try:
        hello_ack(peer, "late-0", epoch=5)
        send_batch(peer, "late-0", 5, 1, robot.batch(8))
        count, cols = robot.batch(8)
        peer.send(encode(envelope("late-0", batch=pb.TransitionBatch(stream_epoch=3, seq=1, count=count)), cols))
        peer.expect_reject("unknown_stream")  # never named: the edge says hello again, naming it
        (current,) = hello_ack(peer, "late-0", epoch=5, spooled=(3,))  # epoch 3 holds nothing yet: no ack
        assert (current.body.stream_epoch, current.body.seq) == (5, 1)
        streams = len(ingest.buffer.index.streams()) + len(ingest.buffer.streams)
        send_batch(peer, "late-0", 3, 1, (count, cols))
        assert len(ingest.buffer.index.streams()) + len(ingest.buffer.streams) == streams + 1  # made by its data
        older, current = hello_ack(peer, "late-0", epoch=5, spooled=(3,))  # a reconnect: where epoch 3 resumes
        assert (older.body.stream_epoch, older.body.seq, older.body.next_seq) == (3, 1, 2)
        send_batch(peer, "late-0", 5, 2, robot.batch(8))
        # Opening the older epoch did not cut the current stream's episode short.
        assert ingest.robots["late-0"].stream.pending is not None
        assert {ep.status for ep in ingest.robots["late-0"].stream.episodes.values()} == {"open"}
        env = hello_envelope("late-0", epoch=5)
        env.hello.spooled_epochs.append(5)  # not older than the stream: a broken edge
        peer.send(encode(env))
        peer.expect_reject("bad_hello")
    finally:
        peer.close()


def test_a_replayed_hello_or_an_old_style_routing_id_cannot_silence_a_robot(
    context: zmq.Context, ingest: Ingest
) -> None:
    link = DataLink(
        context, ingest.endpoint, DeviceDescriptor("sim", "test", "edge-v"), OBS_SPACE, ACTION_SPACE, epoch=11
    )
    attackers = []
    try:
        link.hello()
        wait_until(lambda: link.welcomed, pump=lambda: link.poll(20))
        robot = Episodes(40)
        link.send_batch(*robot.batch(10))
        wait_until(lambda: not link.unacked, pump=lambda: link.poll(20))
        hello_frames = encode(envelope("edge-v", hello=link._hello))  # what a recorder of the wire saw
        for routing_id in (b"edge-v:11", None, None, None, None, None):  # the old id, then plain replays
            attacker = RawPeer(context, ingest.endpoint) if routing_id is None else None
            if attacker is None:
                attacker = RawPeer.__new__(RawPeer)
                attacker.socket = context.socket(zmq.DEALER)
                attacker.socket.setsockopt(zmq.LINGER, 0)
                attacker.socket.setsockopt(zmq.ROUTING_ID, routing_id)
                attacker.socket.connect(ingest.endpoint)
            attackers.append(attacker)
            attacker.send(hello_frames)
            assert attacker.reply().kind == "ack"
            for _ in range(3):  # the robot streams on between replays
                link.send_batch(*robot.batch(10))
            wait_until(lambda: not link.unacked, timeout=link.settings.ack_timeout_s + 5, pump=lambda: link.poll(20))
        assert link.seq == 19 and ingest.robots["edge-v"].stream.durable_seq == 19
        assert ingest.robots["edge-v"].transitions == 190
        assert link.rejects == {} and link.reconnects == 0  # never refused, never had to reconnect
    finally:
        link.close()
        for attacker in attackers:
            attacker.close()


def test_step_credit_never_promises_more_than_the_step_budget_and_never_shrinks(tmp_path) -> None:
    """Per-stream credit (cloud/credit.py): grants only grow (an edge may already have stepped on
    one), and steps promised but not yet stored never exceed what is left of stop.max_env_steps."""
    from user_rl.cloud.buffer.index import StreamRecord
    from user_rl.cloud.buffer.rows import StreamState
    from user_rl.cloud.credit import StepCredit

    a, b = (StreamState(StreamRecord(i, f"sim-{i}", 1, ""), i, 0) for i in (1, 2))
    credit = StepCredit()
    credit.increment, credit.max_records = 100, 600
    assert credit.grant(a, stored=0) == 100 and credit.grant(b, stored=0) == 100
    a.records, b.records = 260, 240  # uneven: a ran ahead
    # b's earlier grant (100) is all stored already, so it holds back nothing of the budget.
    assert credit.grant(a, stored=500) == 260 + (600 - 500 - 0)  # = 360: all that is left
    assert credit.grant(b, stored=500) == 240  # nothing left for b now: a holds the rest
    credit.increment = 10  # the learner slows the fleet: a's grant does not shrink
    assert credit.grant(a, stored=500) == 360
    assert credit.outstanding() == 100
    credit.forget(a)  # a's edge restarted: its unused promise goes back to the budget
    assert credit.grant(b, stored=500) == 250
    credit.increment = -50  # the learner fell behind: b waits, and its grant is never below 1 (0 = no limit)
    fresh = StreamState(StreamRecord(3, "sim-3", 1, ""), 3, 0)
    assert credit.grant(b, stored=500) == 250 and credit.grant(fresh, stored=500) == 1
    credit.increment = None
    assert credit.grant(b, stored=500) == 0  # unpaced: no limit on the wire
