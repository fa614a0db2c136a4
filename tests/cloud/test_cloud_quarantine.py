"""A refused batch never stops a robot's stream: the learner acks it as refused (with the reason),
keeps it in its quarantine, counts it per robot and takes the next seq. Real ZeroMQ sockets, a
real edge link and its disk spool, the quarantine file read back."""

from __future__ import annotations

import numpy as np
import zmq

from tests.cloud.test_cloud_ingest import Episodes, RawPeer, hello_envelope, wait_until, welcomed_link
from user_rl.cloud.ingest import Ingest
from user_rl.cloud.quarantine import quarantine_file, read_quarantine
from user_rl.testing.wait import serving
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import encode, envelope


def batch(robot_id: str, seq: int, count: int, cols: dict[str, np.ndarray]) -> list:
    return encode(envelope(robot_id, batch=pb.TransitionBatch(stream_epoch=1, seq=seq, count=count)), cols)


def test_a_refused_batch_is_acked_as_refused_and_the_next_seq_is_taken(context: zmq.Context, ingest: Ingest) -> None:
    peer = RawPeer(context, ingest.endpoint)
    try:
        peer.send(encode(hello_envelope("raw-0", epoch=1)))
        assert peer.reply().kind == "ack"
        robot = Episodes(50)
        count, first = robot.batch(8)
        peer.send(batch("raw-0", 1, count, first))
        peer.ack_where(lambda a: a.seq == 1)

        count, glitch = robot.batch(8)
        glitch["obs/state"][5, 1] = np.nan  # a sensor glitch in one observation
        peer.send(batch("raw-0", 2, count, glitch))
        refused = peer.ack_where(lambda a: a.refused_seq != 0)
        assert refused.refused_seq == 2 and refused.stream_epoch == 1
        assert refused.refused_reason == "non_finite: obs/state holds NaN or inf"
        assert peer.ack_where(lambda a: a.seq >= 2).refused_seq == 0  # durable: seq 2 is taken

        count, after = robot.batch(8)
        peer.send(batch("raw-0", 3, count, after))
        assert peer.ack_where(lambda a: a.seq == 3).next_seq == 0  # in order: no gap to resume from
        session = ingest.robots["raw-0"]
        assert session.transitions == 16 and session.stream.durable_seq == 3
        # No pair crosses the refused batch: the row before it waits for no successor.
        assert session.stream.dropped == 1 and len(ingest.buffer) == 7 + 7

        report = ingest.report()
        assert report["robots"]["raw-0"]["quarantined_batches"] == 1 and report["quarantine"]["batches"] == 1
        assert report["rejected"] == {"non_finite": 1}
        ((record, kept),) = read_quarantine(quarantine_file(ingest.quarantine.directory, "raw-0"))
        assert (record["robot"], record["epoch"], record["seq"], record["count"]) == ("raw-0", 1, 2, 8)
        assert record["reason"] == "non_finite: obs/state holds NaN or inf"
        assert np.isnan(kept.arrays["obs/state"][5, 1]) and np.array_equal(kept.arrays["action"], glitch["action"])
    finally:
        peer.close()


def test_a_real_edge_link_streams_on_past_a_refused_batch(context: zmq.Context, ingest: Ingest) -> None:
    """The edge's side: the refused batch leaves its spool with the cumulative ack, is never sent
    again, and its later batches are acked; it counts the refusal and keeps the reason."""
    link = welcomed_link(context, ingest, "edge-0", epoch=7)
    try:
        robot = Episodes(25)
        link.send_batch(*robot.batch(10))
        count, glitch = robot.batch(10)
        glitch["reward"][2] = np.inf
        link.send_batch(count, glitch)
        for _ in range(3):
            link.send_batch(*robot.batch(10))
        wait_until(lambda: link.unacked == 0 and link.refused_batches == 1, pump=lambda: link.poll(20))
        assert link.spool.pending() == [] and link.refused is None
        assert link.last_reject == "batch 2 of epoch 7 refused and quarantined: non_finite: reward holds NaN or inf"
        session = ingest.robots["edge-0"]
        assert session.transitions == 40 and session.stream.durable_seq == 5 and session.quarantined_batches == 1
        sent = link.resends
        for _ in range(30):  # nothing is sent again, and the refusal was quarantined once
            link.poll(20)
        assert link.resends == sent and ingest.quarantine.batches == 1
    finally:
        link.close()


def test_a_full_quarantine_keeps_the_line_not_the_frames_and_the_stream_goes_on(context: zmq.Context, tmp_path) -> None:
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer", max_quarantine_bytes=12_000)
    peer = RawPeer(context, ingest.endpoint)
    try:
        with serving(lambda: ingest.poll(50)) as crashed:
            peer.send(encode(hello_envelope("raw-1", epoch=1)))
            assert peer.reply().kind == "ack"
            robot = Episodes(50)
            for seq in range(1, 11):
                count, cols = robot.batch(8)
                cols["action"][0, 0] = 7.0  # outside the action space, every time
                peer.send(batch("raw-1", seq, count, cols))
                assert peer.ack_where(lambda a: a.refused_seq != 0).refused_seq == seq
            count, cols = robot.batch(8)
            peer.send(batch("raw-1", 11, count, cols))
            peer.ack_where(lambda a: a.seq == 11)
        assert not crashed, crashed
        records = list(read_quarantine(quarantine_file(ingest.quarantine.directory, "raw-1")))
        with_frames = [r for r, msg in records if msg is not None]
        assert 1 <= len(with_frames) < len(records) <= 10  # frames while they fit, then lines alone
        assert all(r["reason"].startswith("out_of_bounds") for r, _ in records)
        size = quarantine_file(ingest.quarantine.directory, "raw-1").stat().st_size
        report = ingest.report()["quarantine"]
        assert size <= 12_000 and report["bytes"] == size and report["frames_not_kept"] == 10 - len(with_frames)
        assert report["batches"] == 10 and ingest.robots["raw-1"].transitions == 8
    finally:
        peer.close()
        ingest.close()
