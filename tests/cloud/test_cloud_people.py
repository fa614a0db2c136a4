"""Who did what in the data, by person name (issue 33, part 6): each row records which person acted
and which one labelled it, as ids into the names its batch carries; the buffer keeps the names
run-wide, durably before the rows that use them, and `buffer inspect` counts rows and labels by name,
over the buffer and per robot.

Real parts: edges' batches over real ZeroMQ sockets into the learner's ingest, real buffer files
(sealed, and left open by a SIGKILL), a buffer from before the columns, and the teleop page's own
intervention source handed name after name by a hostile page."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import zmq

from tests.cloud.test_cloud_ingest import ACTION_SPACE, OBS_SPACE, wait_until, welcomed_link
from user_rl.cloud.buffer import store as store_module
from user_rl.cloud.buffer.episodes import read_episodes
from user_rl.cloud.buffer.index import BufferIndex
from user_rl.cloud.buffer.inspect import format_report, inspect_buffer
from user_rl.cloud.buffer.people import MAX_PEOPLE
from user_rl.cloud.buffer.segment import read_layout
from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.cloud.buffer.who import PEOPLE_SHOWN, UNNAMED
from user_rl.cloud.ingest import Ingest
from user_rl.edge.batching import BatchBuilder, TakenBatch
from user_rl.edge.intervention import InterventionMux, StepView
from user_rl.edge.link import DataLink
from user_rl.edge.teleop.source import WebTeleop
from user_rl.testing.wait import serving
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import ACTOR_PERSON, LABEL_PERSON, MAX_BATCH_PEOPLE, MAX_PERSON_CHARS, PERSON_COLUMNS

STEPS = 12  # per episode: the policy 4, a person 6 (the last 2 holding nothing), the scripted intervener 2
DRIVERS = {"arm-0": ("alice", "bob"), "arm-1": ("alice", "Zoë Müller-Łukasiewicz")}  # by episode, in turn
MARKER = {"arm-0": "carol", "arm-1": ""}  # who marks arm-0's episodes; arm-1's driver marks its own


class Robot:
    """Writes a robot's episodes as its edge does, and keeps who did what on each row."""

    def __init__(self, robot: str) -> None:
        self.robot = robot
        self.episode = 0
        self.t = 0
        self.rows: list[tuple[str, bool, int, str]] = []  # (person who acted, idle, label, person who labelled)

    def obs(self) -> dict[str, np.ndarray]:
        return {
            "image": np.full((4, 4, 3), self.t % 256, np.uint8),
            "state": np.full(3, (self.t % 100) / 100, np.float32),
        }

    def batches(self, episodes: int, rows: int = 8) -> list[TakenBatch]:
        """`episodes` episodes, cut into batches of `rows` (a name's id differs from batch to batch)."""
        builder, out = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=rows), []
        for _ in range(episodes):
            driver = DRIVERS[self.robot][self.episode % 2]
            for step in range(STEPS):
                actor = pb.ACTOR_POLICY if step < 4 else pb.ACTOR_HUMAN if step < 10 else pb.ACTOR_SCRIPTED
                person = driver if actor == pb.ACTOR_HUMAN else ""
                idle = actor == pb.ACTOR_HUMAN and step >= 8
                ends = step == STEPS - 1
                success = self.episode % 2 == 0
                label = (pb.LABEL_SUCCESS if success else pb.LABEL_FAILURE) if ends else pb.LABEL_NONE
                by_person = ends and self.episode % 3 != 2  # every third episode the env labels
                marker = (MARKER[self.robot] or driver) if by_person else ""
                obs = self.obs()
                self.t += 1
                builder.add(
                    obs,
                    np.zeros(2, np.float32),
                    1.0,
                    ends and success,
                    ends and not success,
                    episode=self.episode,
                    step=step,
                    policy_version=2,
                    actor=actor,
                    label=label,
                    label_by=pb.LABEL_BY_PERSON if by_person else pb.LABEL_BY_ENV,
                    sensor_time=time.time(),
                    final_obs=self.obs() if ends else None,
                    idle=idle,
                    person=person,
                    label_person=marker,
                )
                self.rows.append((person, idle, label, marker))
                if builder.full:
                    out.append(builder.take_batch())
            self.episode += 1
        if builder.count:
            out.append(builder.take_batch())
        return out

    def expected(self) -> dict[str, dict]:
        """What inspect should count for this robot's rows, by name."""
        return expected_people(self.rows)


def expected_people(rows: list[tuple[str, bool, int, str]]) -> dict[str, dict]:
    people: dict[str, dict] = {}

    def person(name: str) -> dict:
        return people.setdefault(name, {"acted": 0, "idle": 0, "labelled": {"success": 0, "failure": 0}})

    for acted_by, idle, label, labelled_by in rows:
        if acted_by:
            person(acted_by)["acted"] += 1
            person(acted_by)["idle"] += int(idle)
        if labelled_by:
            person(labelled_by)["labelled"]["success" if label == pb.LABEL_SUCCESS else "failure"] += 1
    return dict(sorted(people.items(), key=lambda item: item[0].casefold()))


def merged(*robots: Robot) -> dict[str, dict]:
    return expected_people([row for robot in robots for row in robot.rows])


def send_all(link: DataLink, batches: list[TakenBatch]) -> None:
    """Send as the edge daemon does, and wait until the learner has acknowledged every batch (durable)."""
    for taken in batches:
        assert link.send_batch(taken.count, taken.columns, taken.people) is not None
    wait_until(lambda: link.unacked == 0 and not link.refused_batches, pump=lambda: link.poll(20))


def names_by_row(directory: Path) -> dict[tuple[str, int], list[tuple[str, str]]]:
    """Each exported episode's (who acted, who labelled) per step, by name."""
    return {
        (e.robot, e.number): [(e.people.get(int(a), ""), e.people.get(int(b), "")) for a, b in zip(*columns(e))]
        for e in read_episodes(directory)
    }


def columns(episode) -> tuple[np.ndarray, np.ndarray]:
    return episode.steps[ACTOR_PERSON], episode.steps[LABEL_PERSON]


def sent_by_row(robot: Robot) -> dict[tuple[str, int], list[tuple[str, str]]]:
    rows = robot.rows
    return {(robot.robot, e): [(r[0], r[3]) for r in rows[e * STEPS : (e + 1) * STEPS]] for e in range(robot.episode)}


def test_names_go_from_the_edges_through_the_ingest_into_the_buffer_and_inspect(tmp_path: Path) -> None:
    context = zmq.Context()
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer")
    robots = [Robot("arm-0"), Robot("arm-1")]
    try:
        with serving(lambda: ingest.poll(50)) as crashed:
            for robot in robots:
                link = welcomed_link(context, ingest, robot.robot, epoch=1)
                try:
                    send_all(link, robot.batches(6))
                finally:
                    link.close()
        assert not crashed, crashed
        stats = ingest.report()["buffer_stats"]
        assert stats["people"] == 4 and stats["unnamed_person_rows"] == 0
    finally:
        ingest.close()  # seals the buffer
        context.term()
    directory = tmp_path / "buffer"
    report = inspect_buffer(directory)
    who = report["who"]
    assert who["people"] == merged(*robots)
    assert who["people"]["alice"] == {"acted": 36, "idle": 12, "labelled": {"success": 2, "failure": 0}}
    assert who["people"]["carol"] == {"acted": 0, "idle": 0, "labelled": {"success": 2, "failure": 2}}
    assert who["unnamed"] == {"acted": 0, "idle": 0, "labelled": {"success": 0, "failure": 0}}
    for robot in robots:
        assert report["robots"][robot.robot]["who"]["people"] == robot.expected(), robot.robot
    # One id per name for the whole run, whatever id each batch gave it.
    index = BufferIndex(directory / "index.sqlite", read_only=True)
    try:
        assert sorted(index.people().values()) == sorted(who["people"])
    finally:
        index.close()
    # Exports read the same names for every step.
    assert names_by_row(directory) == {**sent_by_row(robots[0]), **sent_by_row(robots[1])}
    text = cli(directory).stdout
    assert "people by name: 4 people named" in text and "name nobody" not in text
    people = text[text.index("\nperson ") + 1 :].split("\n\n")[0].splitlines()
    assert people[1].split() == ["alice", "36", "12", "2", "success", "/", "0", "failure"]
    by_robot = text[text.index("robot  person") :].split("\n\n")[0].splitlines()
    assert [row.split("  ")[:2] for row in by_robot[1:]] == [
        ["arm-0", "alice"],
        ["arm-0", "bob"],
        ["arm-0", "carol"],
        ["arm-1", "alice"],
        ["arm-1", "Zoë Müller-Łukasiewicz"],
    ]
    assert json.loads(cli(directory, "--json").stdout)["who"]["people"] == who["people"]


def cli(directory: Path, *args: str) -> subprocess.CompletedProcess:
    run = subprocess.run(
        [sys.executable, "-m", "user_rl.cli", "buffer", "inspect", str(directory), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    return run


def ack_then_crash(directory: str) -> None:
    """In a child: a learner's ingest takes an edge's batches, acknowledges them all (durable), and the
    process is killed before anything is sealed."""
    context = zmq.Context()
    ingest = Ingest(context, "tcp://127.0.0.1:0", Path(directory) / "buffer")
    with serving(lambda: ingest.poll(50)):
        link = welcomed_link(context, ingest, "arm-0", epoch=1)
        send_all(link, Robot("arm-0").batches(4))
    os.kill(os.getpid(), signal.SIGKILL)


def test_acknowledged_names_survive_a_crash(tmp_path: Path) -> None:
    child = multiprocessing.get_context("fork").Process(target=ack_then_crash, args=(str(tmp_path),))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    directory = tmp_path / "buffer"
    assert list(directory.glob("open-*.seg")) and not list(directory.glob("seg-*.seg"))  # nothing sealed
    sent = Robot("arm-0")
    sent.batches(4)  # what the child sent, again
    # The names were in the index before the rows that use them were acknowledged ...
    index = BufferIndex(directory / "index.sqlite", read_only=True)
    try:
        assert sorted(index.people().values()) == sorted(sent.expected())
    finally:
        index.close()
    # ... and the reopened buffer seals the acknowledged rows with them.
    PersistentReplay(directory, OBS_SPACE, ACTION_SPACE).close()
    report = inspect_buffer(directory)
    assert report["ok"] and report["who"]["records"] == 4 * STEPS
    assert report["who"]["people"] == sent.expected() and report["who"]["unnamed"]["acted"] == 0
    assert names_by_row(directory) == sent_by_row(sent)


def test_a_buffer_from_before_names_reads_as_nobody_named_and_goes_on_with_names(tmp_path: Path, monkeypatch) -> None:
    """Its segments lack the person columns, its index the people table, its edges sent no names: its
    person rows and labels name nobody (inspect and exports read it), and its open episode continues
    with a newer edge's named rows."""
    directory = tmp_path / "buffer"
    without = store_module.segment_schema

    def old_schema(*spaces):
        return {name: column for name, column in without(*spaces).items() if name not in PERSON_COLUMNS}

    old_edge = Robot("arm-0")
    batches = old_edge.batches(3, rows=STEPS)
    with monkeypatch.context() as patch:
        patch.setattr(store_module, "segment_schema", old_schema)
        old = PersistentReplay(directory, OBS_SPACE, ACTION_SPACE)
        stream = old.open_stream("arm-0", 1, "reach")
        for seq, taken in enumerate(batches[:2], 1):  # an old edge: no person columns, no names
            assert old.add(stream, seq, {k: v for k, v in taken.columns.items() if k not in PERSON_COLUMNS})
        half = {k: v[:6] for k, v in batches[2].columns.items() if k not in PERSON_COLUMNS and "final" not in k}
        half["final_row"] = np.zeros(0, np.int64)
        assert old.add(stream, 3, half)  # episode 2 stays open: its edge goes on later
        old.close()
    with sqlite3.connect(directory / "index.sqlite") as db:
        db.execute("DROP TABLE people")  # as an index from before it
    db.close()
    for path in directory.glob("seg-*.seg"):
        assert ACTOR_PERSON not in [column["name"] for column in read_layout(path)["columns"]]

    report = inspect_buffer(directory)
    person_rows = 2 * 6 + 2  # the 2 whole episodes' person steps, and 2 of the open one's 6 steps
    assert report["ok"] and report["who"]["people"] == {}
    assert report["who"]["unnamed"] == {"acted": person_rows, "idle": 4, "labelled": {"success": 1, "failure": 1}}
    assert f"people by name: 0 people named; {person_rows} person rows and 2 person labels name nobody" in (
        format_report(report)
    )
    assert all(name == ("", "") for rows in names_by_row(directory).values() for name in rows)

    buffer = PersistentReplay(directory, OBS_SPACE, ACTION_SPACE)  # a newer learner: the columns, the table
    rest = batches[2].columns
    second = {k: v[6:] for k, v in rest.items() if "final" not in k}
    second["final_row"] = rest["final_row"] - 6
    second.update({k: v for k, v in rest.items() if k.startswith("final_obs")})
    assert buffer.add(buffer.stream("arm-0", 1), 4, second, batches[2].people)
    buffer.close()
    report = inspect_buffer(directory)
    newer = old_edge.rows[2 * STEPS + 6 :]  # episode 2's steps 6-11: alice drives 4 (2 idle), the env labels
    assert report["who"]["people"] == expected_people(newer)
    assert report["who"]["people"] == {"alice": {"acted": 4, "idle": 2, "labelled": {"success": 0, "failure": 0}}}
    assert report["who"]["unnamed"]["acted"] == person_rows
    names = names_by_row(directory)[("arm-0", 2)]
    assert names[:6] == [("", "")] * 6 and names[6:] == [(r[0], r[3]) for r in newer]


HOSTILE_NAMES = 10_000


def test_a_page_that_sends_ten_thousand_names_costs_bounded_memory(tmp_path: Path) -> None:
    """A page takes over under a new name on every step (each too long, with control characters): the
    teleop source and the edge's batches name at most MAX_BATCH_PEOPLE each, cut to MAX_PERSON_CHARS
    printable characters; the buffer keeps MAX_PEOPLE names and counts the rest's rows as nobody
    named; inspect's text shows PEOPLE_SHOWN of them."""
    source = WebTeleop((2,), ACTION_SPACE.low, ACTION_SPACE.high)
    mux = InterventionMux([source])
    builder = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=64)
    obs = {"image": np.zeros((4, 4, 3), np.uint8), "state": np.zeros(3, np.float32)}
    context = zmq.Context()
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer")
    widest = Counter()
    try:
        with serving(lambda: ingest.poll(50)) as crashed:
            link = welcomed_link(context, ingest, "arm-0", epoch=1)
            for step in range(HOSTILE_NAMES):
                if step:
                    source.hand_back(f"page-{step - 1}")
                source.take_over(f"page-{step}", f"mallory {step:05d}\x1b[2J\n" + "x" * 200)
                action, actor = mux.choose(StepView(obs, np.zeros(2, np.float32), 0, step))
                assert actor == pb.ACTOR_HUMAN
                builder.add(
                    obs, action, 0.0, False, False, episode=0, step=step, policy_version=0, actor=actor,
                    label=pb.LABEL_NONE, sensor_time=0.0, person=mux.person,
                )  # fmt: skip
                if builder.full:
                    taken = builder.take_batch()
                    widest["people"] = max(widest["people"], len(taken.people))
                    widest["chars"] = max(widest["chars"], *(len(name) for name in taken.people))
                    assert all(name.isprintable() for name in taken.people)
                    link.send_batch(taken.count, taken.columns, taken.people)
                    link.poll(0)
            taken = builder.take_batch()
            link.send_batch(taken.count, taken.columns, taken.people)
            wait_until(lambda: link.unacked == 0, timeout=60, pump=lambda: link.poll(20))
            assert link.refused_batches == 0
            link.close()
        assert not crashed, crashed
        stats = ingest.report()["buffer_stats"]
    finally:
        ingest.close()
        context.term()
    assert widest == {"people": MAX_BATCH_PEOPLE, "chars": MAX_PERSON_CHARS}
    # each full batch of 64 rows named its first 32 drivers; the last batch, its 16
    sent = (HOSTILE_NAMES // 64) * MAX_BATCH_PEOPLE + min(HOSTILE_NAMES % 64, MAX_BATCH_PEOPLE)
    assert sent > MAX_PEOPLE  # more names reached the buffer than it keeps
    assert stats["people"] == MAX_PEOPLE and stats["unnamed_person_rows"] == sent - MAX_PEOPLE
    index = BufferIndex(tmp_path / "buffer" / "index.sqlite", read_only=True)
    try:
        kept = index.people()
    finally:
        index.close()
    assert len(kept) == MAX_PEOPLE and max(kept) == MAX_PEOPLE
    assert all(name.startswith("mallory ") and len(name) <= MAX_PERSON_CHARS for name in kept.values())
    report = inspect_buffer(tmp_path / "buffer")
    who = report["who"]
    assert len(who["people"]) == MAX_PEOPLE and all(p["acted"] == 1 for p in who["people"].values())
    assert who["unnamed"]["acted"] == HOSTILE_NAMES - MAX_PEOPLE
    text = format_report(report)
    table = text[text.index("\nperson ") + 1 :].split("\n\n")[0].splitlines()
    assert (
        len(table) == 1 + PEOPLE_SHOWN + 1
        and table[-1] == f"... and {MAX_PEOPLE + 1 - PEOPLE_SHOWN:,} more (--json lists them all)"
    )
    assert UNNAMED in text


@pytest.mark.parametrize(
    ("people", "ids", "why"),
    [
        ([f"p{i}" for i in range(MAX_BATCH_PEOPLE + 1)], 1, "33 names in one batch"),
        (["x" * (MAX_PERSON_CHARS + 1)], 1, "too long or unprintable"),
        (["eve\nroot"], 1, "too long or unprintable"),
        (["eve", "eve"], 1, "listed twice"),
        (["eve"], 2, "actor_person 2 names nobody"),
        ([], 1, "actor_person 1 names nobody"),
    ],
)
def test_a_batch_whose_names_break_the_rules_is_refused_and_its_stream_goes_on(
    context: zmq.Context, ingest: Ingest, people: list[str], ids: int, why: str
) -> None:
    link = welcomed_link(context, ingest, "arm-0", epoch=1)
    try:
        robot = Robot("arm-0")
        bad, good = robot.batches(2, rows=STEPS)
        bad.columns[ACTOR_PERSON][bad.columns[ACTOR_PERSON] > 0] = ids
        link.send_batch(bad.count, bad.columns, people)  # the link sends what it is given
        link.send_batch(good.count, good.columns, good.people)
        wait_until(lambda: link.unacked == 0, pump=lambda: link.poll(20))
        assert link.refused_batches == 1 and ingest.rejected["bad_people"] == 1
        assert link.last_reject.startswith("batch 1 of epoch 1 refused and quarantined: bad_people: ")
        assert why in link.last_reject
        assert ingest.buffer.records == STEPS  # the next batch was stored
    finally:
        link.close()


def test_a_batch_names_each_person_once_and_never_drops_names_silently() -> None:
    builder = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=4)
    obs = {"image": np.zeros((4, 4, 3), np.uint8), "state": np.zeros(3, np.float32)}
    for person, label_person in (("  alice ", ""), ("alice", "bob"), ("", "al\tice"), ("", "")):
        builder.add(
            obs, np.zeros(2, np.float32), 0.0, False, False, episode=0, step=0, policy_version=0,
            actor=pb.ACTOR_HUMAN, label=pb.LABEL_NONE, sensor_time=0.0, person=person, label_person=label_person,
        )  # fmt: skip
    with pytest.raises(ValueError, match="take_batch"):
        builder.take()  # (count, columns) would lose the names
    taken = builder.take_batch()
    assert taken.people == ("alice", "bob", "al?ice")
    assert taken.columns[ACTOR_PERSON].tolist() == [1, 1, 0, 0] and taken.columns[LABEL_PERSON].tolist() == [0, 2, 3, 0]
    assert builder.take_batch().people == ()  # the next batch starts with nobody
