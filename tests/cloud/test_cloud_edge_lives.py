"""Edge lives that die while the learner is down (issue 29, point 7): every complete episode of a
dead life's spool arrives complete, the episode it died in (and only that one) ends as
`edge_restart`, nothing stays open, and the index's episode lengths equal the rows the segments
hold (`buffer inspect` checks that and reports a mismatch). Real ingests on real sockets, real
spools and buffer files; the learner "restarts" as a new ingest on the same buffer directory."""

from __future__ import annotations

from pathlib import Path

import zmq

from tests.cloud.test_cloud_ingest import Episodes
from tests.edge.test_edge_link import NOWHERE, deliver, make_link
from user_rl.cloud.buffer.index import BufferIndex
from user_rl.cloud.buffer.inspect import format_report, inspect_buffer
from user_rl.cloud.ingest import Ingest
from user_rl.testing.wait import serving

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
    assert summary[life_a.epoch] == [(0, 50, "truncated", ""), (1, 50, "truncated", ""),
                                     (2, 40, "truncated", "edge_restart")], summary
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
