"""The edge's data link against a live ingest and a learner that goes silent: unreadable spool
files become explicit gaps on both sides, spooled epochs of earlier lives arrive by name, unacked
data is never deleted, and a silent connection is replaced by a new one."""

from __future__ import annotations

import time
from pathlib import Path

import zmq

from tests.cloud.test_cloud_ingest import ACTION_SPACE, OBS_SPACE, Episodes, wait_until
from user_rl.cloud.ingest import Ingest
from user_rl.edge.link import DataLink, LinkSettings
from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import Message, decode, encode, envelope

NOWHERE = "tcp://127.0.0.1:9"  # nobody listens: batches stay in the spool


def make_link(context: zmq.Context, address: str, spool: Path, **settings) -> DataLink:
    return DataLink(
        context,
        address,
        DeviceDescriptor("sim", "test", "edge-l"),
        OBS_SPACE,
        ACTION_SPACE,
        settings=LinkSettings(spool_dir=str(spool), **settings),
    )


def flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))


def deliver(link: DataLink) -> None:
    link.hello()
    wait_until(lambda: link.welcomed and link.unacked == 0, timeout=30, pump=lambda: link.poll(20))


def test_a_corrupt_file_of_the_running_stream_is_a_reported_gap(context, ingest: Ingest, tmp_path: Path) -> None:
    robot = Episodes(1000)
    link = make_link(context, ingest.endpoint, tmp_path / "spool")
    try:
        for _ in range(4):  # spooled, not yet sent: the link waits for its welcome
            link.send_batch(*robot.batch(10))
        flip_a_bit(link.spool.path(link.epoch, 2))
        deliver(link)
        link.send_batch(*robot.batch(10))
        wait_until(lambda: link.unacked == 0, timeout=30, pump=lambda: link.poll(20))
        assert link.lost_batches == 1 and link.refused is None
        session = ingest.robots["edge-l"]
        assert ingest.lost_batches == 1 and session.lost_batches == 1
        assert session.stream.durable_seq == 5 and session.transitions == 40  # every other batch, once
        assert not list((tmp_path / "spool").glob("*.batch"))  # the tombstone went with the ack
    finally:
        link.close()


def test_an_earlier_lifes_spool_arrives_by_name_with_its_gaps(context, ingest: Ingest, tmp_path: Path) -> None:
    """Lives started and killed while the learner was down: their epochs are announced in the hello;
    a torn and a flipped file (the last one, too) become gaps, after a restart as well."""
    robot = Episodes(1000)
    lives = []
    for _ in range(2):
        life = make_link(context, NOWHERE, tmp_path / "spool")
        for _ in range(6):
            life.send_batch(*robot.batch(10))
        life.close()
        lives.append(life)
    lives[0].spool.path(lives[0].epoch, 2).write_bytes(b"URS1 torn")
    flip_a_bit(lives[0].spool.path(lives[0].epoch, 6))
    link = make_link(context, ingest.endpoint, tmp_path / "spool")
    try:
        assert lives[0].epoch < lives[1].epoch < link.epoch
        deliver(link)
        link.send_batch(*robot.batch(10))
        wait_until(lambda: link.unacked == 0, timeout=30, pump=lambda: link.poll(20))
        assert link.lost_batches == 2 and ingest.lost_batches == 2
        ingest.maybe_commit(force=True)
        keys = ingest.buffer.batch_keys() | ingest.buffer.lost_keys()  # stored and explicit gaps: every seq
        # seq 7 of each dead life: the end marker the next life wrote after its data
        assert {(e, s) for _, e, s in keys} == {(life.epoch, s) for life in lives for s in range(1, 8)} | {
            (link.epoch, 1)
        }
        assert {(e, s) for _, e, s in ingest.buffer.lost_keys()} == {(lives[0].epoch, 2), (lives[0].epoch, 6)}
        assert ingest.robots["edge-l"].transitions == 10 * (6 + 4 + 1)
        assert ingest.rejected == {}  # no epoch was unknown: the hello named them
    finally:
        link.close()


class SilentLearner:
    """A ROUTER that welcomes a hello and then answers as it is told (or not at all)."""

    def __init__(self, context: zmq.Context) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind("tcp://127.0.0.1:0")
        self.address = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def next_hello(self, link: DataLink, timeout_s: float = 10.0) -> tuple[bytes, Message]:
        """The next hello, pumping the link meanwhile (it repeats a hello sent before it was connected)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            link.poll(0)
            if self.socket.poll(20):
                identity, *frames = self.socket.recv_multipart()
                msg = decode(frames)
                if msg.kind == "hello":
                    return identity, msg
        raise AssertionError("the link said no hello")

    def reply(self, identity: bytes, **body) -> None:
        self.socket.send_multipart([identity, *encode(envelope("edge-l", **body))])


def test_a_silent_learner_makes_the_link_reconnect_and_nothing_is_deleted(context, tmp_path: Path) -> None:
    learner = SilentLearner(context)
    robot = Episodes(1000)
    link = make_link(context, learner.address, tmp_path / "spool", ack_timeout_s=0.5)
    try:
        link.hello()
        first, _ = learner.next_hello(link)
        learner.reply(first, ack=pb.Ack(stream_epoch=link.epoch))
        wait_until(lambda: link.welcomed, pump=lambda: link.poll(20))
        link.send_batch(*robot.batch(10))
        # Not a word back: after ack_timeout_s the link drops the connection and says hello anew.
        second, msg = learner.next_hello(link)
        assert second != first and link.reconnects == 1
        assert msg.body.stream_epoch == link.epoch  # the same stream, on a new connection
        # A learner that does not know the stream: the link introduces itself again, deletes nothing.
        learner.reply(second, ack=pb.Ack(stream_epoch=link.epoch))
        wait_until(lambda: link.welcomed, pump=lambda: link.poll(20))
        learner.reply(
            second, reject=pb.Reject(reason=f"unknown_stream: edge-l: epoch {link.epoch} was never announced")
        )
        wait_until(lambda: link.rejects["unknown_stream"] == 1, pump=lambda: link.poll(20))
        assert link.unacked == 1 and not link.welcomed
        assert learner.next_hello(link)[0] == second
    finally:
        link.close()
        learner.socket.close(0)


def test_a_dead_lifes_epoch_gets_one_end_marker_even_in_a_full_spool(context, tmp_path: Path) -> None:
    robot = Episodes(1000)
    dead = make_link(context, NOWHERE, tmp_path / "spool", spool_max_bytes=8000)
    while dead.send_batch(*robot.batch(10)) is not None:  # until the spool refuses
        pass
    dead.close()
    last = dead.spool.last_pending(dead.epoch)
    for _ in range(2):  # two later lives: the dead one's epoch is ended once
        later = make_link(context, NOWHERE, tmp_path / "spool", spool_max_bytes=8000)
        later.close()
        assert later.spool.last_pending(dead.epoch) == last + 1
        marker = decode(later.spool.load(dead.epoch, last + 1))
        assert (marker.body.count, marker.body.end_reason) == (0, "edge_restart")


def test_batches_waiting_for_the_window_wait_in_bounded_ram_and_stay_spooled_until_acked(
    context, tmp_path: Path
) -> None:
    """On a live link, batches the window holds back go out from RAM (no read-back of their files),
    at most `unsent_ram_bytes` of them; the spool keeps every one until it is acked, and after a
    reconnect the link sends them again from there, byte for byte."""
    learner = SilentLearner(context)
    robot = Episodes(1000)
    link = make_link(context, learner.address, tmp_path / "spool", max_in_flight=2, ack_timeout_s=0.5)
    try:
        link.hello()
        first, _ = learner.next_hello(link)
        learner.reply(first, ack=pb.Ack(stream_epoch=link.epoch))
        wait_until(lambda: link.welcomed, pump=lambda: link.poll(20))
        one_batch = sum(
            len(bytes(f)) for f in encode(envelope("edge-l", batch=pb.TransitionBatch()), robot.batch(10)[1])
        )
        link.settings.unsent_ram_bytes = 2 * one_batch + one_batch // 2  # two of the held-back batches fit
        sent = {}
        for _ in range(6):
            seq = link.send_batch(*robot.batch(10))
            sent[seq] = [bytes(f) for f in link.spool.load(link.epoch, seq)]
            assert link._unsent_bytes <= link.settings.unsent_ram_bytes
        assert sorted(link._unsent) == [3, 4]  # 1 and 2 are on the wire; 5 and 6 wait on disk only
        got = {}
        while len(got) < 2:  # the window: two batches, then silence
            if learner.socket.poll(2000):
                _, *frames = learner.socket.recv_multipart()
                got[decode(frames).body.seq] = frames
            else:
                break
        assert sorted(got) == [1, 2] and all(got[s] == sent[s] for s in got)
        # Not a word back: the link reconnects and says hello anew; RAM is let go, the spool keeps all.
        second, _ = learner.next_hello(link)
        assert second != first and link._unsent_bytes == 0 and not link._unsent
        assert link.unacked == 6 and sorted(s for _, s in link.spool.pending(link.epoch)) == list(range(1, 7))
        learner.reply(second, ack=pb.Ack(stream_epoch=link.epoch, seq=1))
        again = {}
        deadline = time.monotonic() + 10
        while len(again) < 2 and time.monotonic() < deadline:
            link.poll(20)
            if learner.socket.poll(20):
                identity, *frames = learner.socket.recv_multipart()
                msg = decode(frames)
                if msg.kind == "batch":
                    again[msg.body.seq] = frames
        assert sorted(again) == [2, 3] and all(again[s] == sent[s] for s in again)  # from the spool, intact
        assert link.unacked == 5 and 1 not in {s for _, s in link.spool.pending(link.epoch)}
    finally:
        link.close()
        learner.socket.close(0)
