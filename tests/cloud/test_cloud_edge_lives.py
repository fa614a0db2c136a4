"""Edge lives that die while the learner is down (issue 29, point 7): every complete episode of a
dead life's spool arrives complete, the episode it died in (and only that one) ends as
`edge_restart`, nothing stays open, and the index's episode lengths equal the rows the segments
hold (`buffer inspect` checks that and reports a mismatch). Real ingests on real sockets, real
spools and buffer files; the learner "restarts" as a new ingest on the same buffer directory."""

from __future__ import annotations

import time
from pathlib import Path

import zmq

from tests.cloud.test_cloud_ingest import Episodes, RawPeer, hello_envelope
from tests.edge.test_edge_link import NOWHERE, deliver, make_link
from user_rl.cloud.buffer.index import BufferIndex
from user_rl.cloud.buffer.inspect import format_report, inspect_buffer
from user_rl.cloud.ingest import Ingest
from user_rl.testing.wait import serving
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import decode, encode, envelope

EDGE_RESTART = "edge_restart"  # the end_reason of the episode an edge life died in
LENGTH = 50  # steps per episode: each ends truncated by its time limit (a complete episode)


def serve_ingest(context: zmq.Context, buffer_dir: Path) -> Ingest:
    return Ingest(context, "tcp://127.0.0.1:0", buffer_dir)


def episodes_by_epoch(buffer_dir: Path) -> dict[int, list]:
    index = BufferIndex(buffer_dir / "index.sqlite", read_only=True)
    try:
        streams = {s.id: s.epoch for s in index.streams()}
        out: dict[int, list] = {}
        for ep in index.episodes():
            out.setdefault(streams[ep.stream], []).append(ep)
        return out
    finally:
        index.close()


def test_lives_that_die_while_the_learner_is_down_keep_complete_episodes_complete(context, tmp_path: Path) -> None:
    buffer_dir, spool = tmp_path / "buffer", tmp_path / "spool"
    robot_a = Episodes(LENGTH)
    first = serve_ingest(context, buffer_dir)
    life_a = make_link(context, first.endpoint, spool)
    try:
        with serving(lambda: first.poll(20)) as crashed:
            for _ in range(3):  # episode 0 open at step 30 when the learner goes down
                life_a.send_batch(*robot_a.batch(10))
            deliver(life_a)
    finally:
        first.close()
    assert not crashed, crashed
    try:
        for _ in range(11):  # learner down: the rest of episode 0, all of episode 1, episode 2 to step 40
            life_a.send_batch(*robot_a.batch(10))
    finally:
        life_a.close()  # killed while the learner is down: 11 batches wait in its spool

    robot_a2 = Episodes(LENGTH)  # a life born and killed during the outage: the learner never heard of it
    life_a2 = make_link(context, NOWHERE, spool)
    for _ in range(7):  # episode 0 complete, episode 1 cut at step 20
        life_a2.send_batch(*robot_a2.batch(10))
    life_a2.close()

    second = serve_ingest(context, buffer_dir)  # the learner is back, on the same buffer
    life_b = make_link(context, second.endpoint, spool)
    try:
        with serving(lambda: second.poll(20)) as crashed:
            assert life_a.epoch < life_a2.epoch < life_b.epoch
            robot_b = Episodes(LENGTH)
            life_b.send_batch(*robot_b.batch(10))
            deliver(life_b)
            assert second.rejected == {}
    finally:
        life_b.close()
        second.close()
    assert not crashed, crashed

    episodes = episodes_by_epoch(buffer_dir)
    summary = {e: [(x.episode, x.length, x.status, x.end_reason) for x in eps] for e, eps in episodes.items()}
    assert summary[life_a.epoch] == [
        (0, 50, "truncated", ""),
        (1, 50, "truncated", ""),
        (2, 40, "truncated", "edge_restart"),
    ], summary
    assert summary[life_a2.epoch] == [(0, 50, "truncated", ""), (1, 20, "truncated", "edge_restart")], summary
    assert summary[life_b.epoch] == [(0, 10, "open", "")], summary
    report = inspect_buffer(buffer_dir)
    print(format_report(report))
    assert report["ok"] and report["episode_length_mismatches"] == [], report["problems"]
    assert report["episodes"]["cut_short"] == 2 and report["episodes"]["open"] == 1
    assert report["records"] == 140 + 70 + 10


def test_buffer_inspect_reports_an_index_length_that_differs_from_the_segment_rows(context, tmp_path: Path) -> None:
    buffer_dir = tmp_path / "buffer"
    ingest = serve_ingest(context, buffer_dir)
    link = make_link(context, ingest.endpoint, tmp_path / "spool")
    try:
        with serving(lambda: ingest.poll(20)):
            robot = Episodes(LENGTH)
            for _ in range(6):
                link.send_batch(*robot.batch(10))
            deliver(link)
    finally:
        link.close()
        ingest.close()
    assert inspect_buffer(buffer_dir)["ok"]
    index = BufferIndex(buffer_dir / "index.sqlite")
    with index.db:
        index.db.execute("UPDATE episodes SET length = 1 WHERE episode = 0")  # the frozen length of issue 29
    index.close()
    report = inspect_buffer(buffer_dir)
    assert not report["ok"] and len(report["episode_length_mismatches"]) == 1
    (mismatch,) = report["episode_length_mismatches"]
    assert (mismatch["episode"], mismatch["index_length"], mismatch["segment_rows"]) == (0, 1, 50)
    assert "EPISODE LENGTH robot edge-l" in format_report(report) and "its segments hold 50" in format_report(report)


def test_a_hello_ends_only_older_epochs_it_no_longer_names(context, tmp_path: Path) -> None:
    """Named epochs stay open until their own marker; unnamed ones end at the hello, unless the edge
    says it spools more than it named and they are newer than the newest named. The ingest is served
    from this thread, so its buffer is read between messages."""
    ingest = serve_ingest(context, tmp_path / "buffer")
    peer = RawPeer(context, ingest.endpoint)
    robot = Episodes(LENGTH)

    def ask(frames, epoch: int, seq: int = 0) -> None:
        peer.send(frames)
        deadline = time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline, "no answer from the ingest"
            ingest.poll(10)
            ingest.maybe_commit(force=True)
            if peer.socket.poll(0):
                reply = decode(peer.socket.recv_multipart())
                assert reply.kind == "ack", reply
                if reply.body.stream_epoch == epoch and reply.body.seq >= seq:
                    return

    def hello(epoch: int, spooled: tuple[int, ...], more: bool = False) -> None:
        env = hello_envelope("lives-0", epoch)
        env.hello.spooled_epochs.extend(spooled)
        env.hello.more_spooled_epochs = more
        ask(encode(env), epoch)

    def batch(epoch: int, seq: int, rows: tuple[int, dict] | None = None, end_reason: str = "") -> None:
        body = pb.TransitionBatch(stream_epoch=epoch, seq=seq, count=rows[0] if rows else 0, end_reason=end_reason)
        ask(encode(envelope("lives-0", batch=body), rows[1] if rows else None), epoch, seq)

    def open_epochs() -> set[int]:
        store = ingest.buffer
        in_ram = {s.record.id for s in store.streams.values()}
        ram = {s.record.epoch for s in store.streams.values() if any(e.status == "open" for e in s.episodes.values())}
        epochs = {s.id: s.epoch for s in store.index.streams()}
        indexed = {
            epochs[ep.stream] for ep in store.index.episodes() if ep.status == "open" and ep.stream not in in_ram
        }
        return ram | indexed

    try:
        hello(2, ())
        batch(2, 1, robot.batch(10))
        hello(4, (2,))  # epoch 2 is still spooled: it stays open
        batch(4, 1, robot.batch(10))
        hello(9, (2,), more=True)  # epoch 4 is not named, but more are spooled than named: it may be
        assert open_epochs() == {2, 4}
        hello(9, (2,))  # now the edge named everything it spools: epoch 4 has all arrived
        assert open_epochs() == {2}
        batch(2, 2, end_reason=EDGE_RESTART)  # epoch 2's own end, after its data
        assert open_epochs() == set()
        ingest.buffer.seal()
        cut = [ep for ep in ingest.buffer.index.episodes() if ep.end_reason == EDGE_RESTART]
        assert sorted(ep.length for ep in cut) == [10, 10]
    finally:
        peer.close()
        ingest.close()
