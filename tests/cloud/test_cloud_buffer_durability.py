"""PersistentReplay when the disk fails, when processes die, and across restarts.

Disk errors are injected by making the os-level call raise (ENOSPC, EIO); crashes are real
SIGKILLs of a forked child that wrote the buffer. Helpers (robots that encode each step in
their observations, the checks of sampled pairs) come from test_cloud_store.
"""

from __future__ import annotations

import copy
import errno
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from test_cloud_store import (
    ACTION_SPACE,
    OBS_SPACE,
    Robot,
    Writer,
    all_transitions,
    episode_length,
    keys_of,
    open_store,
    run_child,
    segment_bytes,
    segment_transitions,
)

from user_rl.cloud.buffer import prefetch, recovery
from user_rl.cloud.buffer.inspect import format_report, inspect_buffer
from user_rl.cloud.buffer.rows import row_bytes, segment_schema
from user_rl.cloud.buffer.segment import read_layout
from user_rl.cloud.buffer.store import BufferWriteError
from user_rl.testing.wait import wait_until
from user_rl.wire.transitions import DISCARD

SLOT_MB = 256 * row_bytes(segment_schema(OBS_SPACE, ACTION_SPACE)) / 2**20


def stream_state(store, robot: str, epoch: int = 1) -> dict:
    s = store.streams[(robot, epoch)]
    return {
        "last_seq": s.record.last_seq,
        "durable_seq": s.durable_seq,
        "pending_at": s.pending_at,
        "pending": None if s.pending is None else {k: v.copy() for k, v in s.pending.items()},
        "episodes": copy.deepcopy(s.episodes),
        "records": s.records,
        "dropped": s.dropped,
    }


def assert_same_state(before: dict, after: dict) -> None:
    assert {k: v for k, v in before.items() if k != "pending"} == {k: v for k, v in after.items() if k != "pending"}
    assert (before["pending"] is None) == (after["pending"] is None)
    if before["pending"] is not None:
        for name, values in before["pending"].items():
            np.testing.assert_array_equal(values, after["pending"][name], name)


def fail_with(monkeypatch, name: str, code: int, after: int = 0) -> list[int]:
    """Make os.<name> raise OSError(code) from its (after+1)-th call on; returns the call counter."""
    real, calls = getattr(os, name), []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) > after:
            raise OSError(code, os.strerror(code))
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, failing)
    return calls


def committed_pairs(robots: list[Robot], emitted: dict[int, int]) -> set:
    """Transitions of each robot's first `emitted[rid]` records (what was committed)."""
    out = set()
    for r in robots:
        clone = copy.copy(r)
        clone.emitted = r.emitted[: emitted[r.rid]]
        out |= clone.paired()
    return out


# -- acked means durable ----------------------------------------------------------------------------


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_failed_append_changes_nothing_and_stops_the_buffer(tmp_path: Path, monkeypatch, code: int) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    a, b = Robot(1), Robot(2)
    for _ in range(3):
        writer.add(a, 7)  # a's episode stays open: its last record waits for a successor
        writer.add(b, 9)
    store.commit()
    keys, emitted = set(writer.keys), {1: len(a.emitted), 2: len(b.emitted)}
    before, size, catalog = stream_state(store, "r1"), len(store), len(store.cache.catalog()["position"])

    with monkeypatch.context() as m:
        fail_with(m, "pwrite", code)
        with pytest.raises(BufferWriteError) as failed:
            store.add(store.streams[("r1", 1)], 4, a.batch(5))
    assert failed.value.errno == code and os.strerror(code) in str(failed.value)
    assert os.strerror(code) in store.failure and store.stats()["failure"] == store.failure
    assert_same_state(before, stream_state(store, "r1"))
    assert len(store) == size and len(store.cache.catalog()["position"]) == catalog
    # From now on the buffer takes nothing, even with a healthy disk: nothing more may be acked.
    for attempt in (lambda: store.add(store.streams[("r2", 1)], 4, b.batch(3)), store.commit, store.seal):
        with pytest.raises(BufferWriteError, match="stopped taking data"):
            attempt()
    assert store.streams[("r2", 1)].durable_seq == 3
    print(f"after the failure: {store.failure}")
    check_committed_only(tmp_path, store, keys, committed_pairs([a, b], emitted))


@pytest.mark.parametrize("failing_sync", [1, 2], ids=["segment_sync", "commit_log_sync"])
def test_a_failed_commit_acks_nothing(tmp_path: Path, monkeypatch, failing_sync: int) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    a, b = Robot(1), Robot(2)
    writer.add(a, 20)
    writer.add(b, 20)
    store.commit()
    keys, emitted = set(writer.keys), {1: len(a.emitted), 2: len(b.emitted)}
    writer.add(a, 6)  # appended, never acknowledged
    writer.add(b, 6)
    with monkeypatch.context() as m:
        fail_with(m, "fdatasync", errno.ENOSPC, after=failing_sync - 1)
        with pytest.raises(BufferWriteError):
            store.commit()
    assert [store.streams[(r, 1)].durable_seq for r in ("r1", "r2")] == [1, 1], "durable_seq moved without a sync"
    assert "No space left" in store.failure
    with pytest.raises(BufferWriteError):
        store.commit()
    check_committed_only(tmp_path, store, keys, committed_pairs([a, b], emitted))


def committing_in_the_background(directory: str) -> None:
    """Child process: a group commit on the commit thread while batches keep coming, then a batch it
    did not cover, then death without closing."""
    store = open_store(Path(directory))
    writer = Writer(store)
    a = Robot(1)
    writer.add(a, 20)
    writer.add(a, 6)
    assert store.start_commit() and store.commit_running
    assert not store.start_commit()  # one at a time
    writer.add(a, 5)  # taken while the disk syncs: not covered by the running commit
    stream = store.streams[("r1", 1)]
    assert store.finish_commit(wait=True) == [stream] and stream.durable_seq == 2
    assert not store.commit_running and store.finish_commit() == []  # reported once
    writer.add(a, 4)  # never committed
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_group_commit_on_the_commit_thread_acks_only_what_it_covered(tmp_path: Path) -> None:
    """The ingest's group commit syncs on the commit thread while batches keep coming: only what it
    covered is reported durable, and after a crash exactly that is back."""
    run_child(committing_in_the_background, str(tmp_path))
    store = open_store(tmp_path)
    assert store.batch_keys() == {("r1", 1, 1), ("r1", 1, 2)}
    a = Robot(1)
    a.batch(20), a.batch(6)
    assert set(all_transitions(store)) == a.paired()
    store.close()


def test_what_a_seal_makes_durable_is_reported_for_its_acks(tmp_path: Path) -> None:
    """A seal commits first (a batch of one robot fills the segment): the other robots' batches it
    made durable are reported at the ingest's next commit check, so their acks do not wait for
    their next batch (or a resend)."""
    store = open_store(tmp_path)
    writer = Writer(store)
    a, b = Robot(1), Robot(2)
    writer.add(a, 20)
    writer.add(b, 7)
    assert store.start_commit()
    writer.add(b, 5)  # not covered by the running commit
    store.seal()
    assert [store.streams[(r, 1)].durable_seq for r in ("r1", "r2")] == [1, 2]
    assert sorted(s.record.robot for s in store.finish_commit()) == ["r1", "r2"]
    assert store.finish_commit() == []  # reported once
    store.close()


@pytest.mark.parametrize("failing_sync", [1, 2], ids=["segment_sync", "commit_log_sync"])
def test_a_failed_group_commit_on_the_commit_thread_acks_nothing(
    tmp_path: Path, monkeypatch, failing_sync: int
) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    a = Robot(1)
    writer.add(a, 20)
    store.commit()
    keys, emitted = set(writer.keys), {1: len(a.emitted)}
    writer.add(a, 6)  # appended, never acknowledged
    with monkeypatch.context() as m:
        fail_with(m, "fdatasync", errno.EIO, after=failing_sync - 1)
        assert store.start_commit()
        with pytest.raises(BufferWriteError):
            store.finish_commit(wait=True)
    assert store.streams[("r1", 1)].durable_seq == 1, "durable_seq moved without a sync"
    assert "Input/output error" in store.failure
    for attempt in (store.start_commit, store.commit):
        with pytest.raises(BufferWriteError, match="stopped taking data"):
            attempt()
    check_committed_only(tmp_path, store, keys, committed_pairs([a], emitted))


def check_committed_only(directory: Path, failed_store, keys: set, pairs: set) -> None:
    """Close the failed store (it writes nothing more) and reopen: exactly what was committed."""
    failed_store.close()
    store = open_store(directory)
    wait_until(lambda: store.scrubber.done, 30, "the scrub")
    assert store.batch_keys() == keys, "an unacknowledged batch came back, or a committed one is missing"
    assert set(all_transitions(store)) == pairs
    assert store.stats()["corrupt_segments"] == [] and store.failure is None
    assert inspect_buffer(directory)["ok"]
    store.close()


# -- eviction ---------------------------------------------------------------------------------------


def test_eviction_marks_the_index_before_it_deletes_a_file(tmp_path: Path, monkeypatch) -> None:
    size = segment_bytes(tmp_path)
    directory = tmp_path / "buf"
    store = open_store(directory, max_disk_gb=2.5 * size / 2**30)
    writer = Writer(store)
    a = Robot(1)
    status_at_unlink = {}
    real_unlink = Path.unlink

    def crashing_unlink(path: Path, missing_ok: bool = False) -> None:
        if path.name.startswith("seg-"):  # a crash right here: the file is still on disk
            status_at_unlink[path.name] = {r.file: r.status for r in store.index.segments(status=None)}[path.name]
            raise OSError(errno.EIO, "simulated crash before the file is deleted")
        real_unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", crashing_unlink)
    for _ in range(16):
        writer.add(a, 50)
        store.commit()
    monkeypatch.undo()
    assert status_at_unlink and set(status_at_unlink.values()) == {"evicted"}, status_at_unlink
    evicted = {r.file for r in store.index.segments(status="evicted")}
    assert evicted == set(status_at_unlink) and all((directory / f).exists() for f in evicted)
    assert store.failure is None, "a file left behind is not a write failure"
    kept = set().union(*(segment_transitions(directory / r.file) for r in store.index.segments()))
    assert kept <= set(all_transitions(store))
    store.close()

    store = open_store(directory, max_disk_gb=2.5 * size / 2**30)  # the next open finishes the job
    assert not any((directory / f).exists() for f in evicted)
    assert store.batch_keys() == writer.keys and store.stats()["corrupt_segments"] == []
    store.close()


# -- an episode cut by an edge restart stays cut --------------------------------------------------


def cut_then_crash(directory: str) -> None:
    store = open_store(Path(directory))
    writer = Writer(store)
    writer.add(Robot(1), episode_length(1, 0) + 4)  # episode 0 ends; episode 1 is open at step 3
    store.commit()
    store.end_open_episodes(store.streams[("r1", 1)], reason="edge_restart")
    os.kill(os.getpid(), signal.SIGKILL)


def write_then_crash(directory: str, rid: int) -> None:
    store = open_store(Path(directory))
    Writer(store).add(Robot(rid), 10, epoch=rid)
    store.commit()
    os.kill(os.getpid(), signal.SIGKILL)


def test_an_episode_cut_by_an_edge_restart_stays_cut_across_crashes(tmp_path: Path) -> None:
    run_child(cut_then_crash, str(tmp_path))
    for crash in range(3):
        store = open_store(tmp_path)
        stream_id = store.streams[("r1", 1)].record.id
        episodes = {(e.stream, e.episode): e for e in store.index.episodes()}
        ep = episodes[(stream_id, 1)]
        assert (ep.status, ep.end_reason, ep.length) == ("truncated", "edge_restart", 4), f"after crash {crash + 1}"
        assert episodes[(stream_id, 0)].status == "terminated"
        assert store.streams[("r1", 1)].pending is None, "nothing may continue a cut episode"
        store.index.close()  # a crash: nothing sealed, nothing closed
        store.prefetcher.close()
        run_child(write_then_crash, str(tmp_path), 5 + crash)
    store = open_store(tmp_path)
    ep = {(e.stream, e.episode): e for e in store.index.episodes()}[(store.streams[("r1", 1)].record.id, 1)]
    assert (ep.status, ep.end_reason) == ("truncated", "edge_restart")
    store.close()


# -- per-stream records, lost batches, releasing streams ---------------------------------------


def commit_then_crash(directory: str) -> None:
    store = open_store(Path(directory))
    writer = Writer(store)
    writer.add(Robot(3), 12)
    store.record_lost(store.open_stream("r3", 1), 2)
    writer.seq[("r3", 1)] = 2
    writer.add(Robot(3, episode=5), 8)
    store.commit()
    os.kill(os.getpid(), signal.SIGKILL)


def test_stream_records_are_kept_across_restarts_and_crashes(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    a, b = Robot(1), Robot(2)
    for rows in (100, 120, 90, 70):
        writer.add(a, rows)
        writer.add(b, rows // 2)
    store.commit()
    assert [store.streams[(r, 1)].records for r in ("r1", "r2")] == [380, 190]
    store.close()
    run_child(commit_then_crash, str(tmp_path))
    store = open_store(tmp_path)
    assert [store.streams[(r, 1)].records for r in ("r1", "r2", "r3")] == [380, 190, 20]
    store.close()


def test_a_lost_batch_moves_the_stream_on_and_is_remembered(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    a = Robot(1)
    writer.add(a, 5)  # episode 0 is open at step 4: its last record waits for a successor
    stream = store.streams[("r1", 1)]
    assert store.record_lost(stream, 2)
    assert not store.record_lost(stream, 2), "a lost seq is not lost twice"
    assert (stream.record.last_seq, stream.pending, stream.dropped) == (2, None, 1)
    assert store.stats()["lost_batches"] == 1
    assert [s.durable_seq for s in store.commit()] == [2], "the lost seq is acked like a batch"
    writer.seq[("r1", 1)] = 2
    writer.add(a, 5)  # steps 5..9 of episode 0: step 4 must not be paired across the gap
    store.commit()
    keys = all_transitions(store)
    assert (1, 0, 4) not in keys and (1, 0, 5) in keys
    assert store.lost_keys() == {("r1", 1, 2)} and ("r1", 1, 2) not in store.batch_keys()
    store.close()

    store = open_store(tmp_path)
    assert store.lost_keys() == {("r1", 1, 2)} and store.stats()["lost_batches"] == 1
    assert not store.add(store.open_stream("r1", 1), 2, Robot(1).batch(3)), "a re-sent lost seq is a duplicate"
    assert store.streams[("r1", 1)].records == 10
    report = inspect_buffer(tmp_path)
    assert report["lost_batches"] == 1 and "1 lost by edges" in format_report(report)
    store.close()

    run_child(commit_then_crash, str(tmp_path))  # lost in the open segment, then a crash
    store = open_store(tmp_path)
    assert store.lost_keys() == {("r1", 1, 2), ("r3", 1, 2)} and store.stats()["lost_batches"] == 2
    assert store.streams[("r3", 1)].record.last_seq == 3
    store.close()


def test_released_streams_leave_ram_and_come_back_from_the_index(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    for i in range(10_000):  # hellos of many (robot, epoch) pairs that send nothing
        stream = store.open_stream(f"robot-{i % 100}", 1 + i // 100)
        assert store.release_stream(stream)
        assert len(store.streams) <= 1
    assert len(store.index.streams()) == 10_000
    assert store.stream("robot-7", 3) is not None and store.stream("nobody", 1) is None
    assert len({s.id for s in store.index.streams()}) == 10_000, "stream ids are never reused"

    # A released stream continues its episode: its pending record comes back from the index.
    writer = Writer(store)
    a = Robot(1)
    writer.add(a, 9)  # episode 0 open at step 8
    stream = store.streams[("r1", 1)]
    assert not store.release_stream(stream), "its data is not sealed yet: released at the next seal"
    store.seal()
    assert ("r1", 1) not in store.streams
    writer.add(a, 3)  # open_stream reloads it; episode 0 (14 steps) stays open at step 11
    store.commit()
    reloaded = store.streams[("r1", 1)]
    assert reloaded is not stream and reloaded.record.id == stream.record.id and reloaded.records == 12
    assert (1, 0, 8) in all_transitions(store), "the reloaded stream continued its episode"

    # A new epoch of a robot whose old stream was released still cuts the old stream's episode.
    store.seal()
    assert store.release_stream(store.streams[("r1", 1)])
    store.end_finished_streams("r1", 2)
    ep = {(e.stream, e.episode): e for e in store.index.episodes()}[(stream.record.id, 0)]
    assert (ep.status, ep.end_reason) == ("truncated", "edge_restart")
    print(f"streams in RAM after 10,000 hellos: {len(store.streams)}")
    store.close()


# -- background threads ----------------------------------------------------------------------------


def test_a_prefetch_error_shows_in_thread_errors_and_the_thread_goes_on(tmp_path: Path, monkeypatch) -> None:
    store = open_store(tmp_path, ram_budget_mb=2.5 * SLOT_MB)
    writer = Writer(store)
    a = Robot(1)
    for _ in range(12):
        writer.add(a, 60)
    store.commit()
    store.close()
    store = open_store(tmp_path, ram_budget_mb=2.5 * SLOT_MB)
    assert store.prefetcher.cold()
    rng = np.random.default_rng(0)

    def broken(*args, **kwargs):
        raise RuntimeError("disk controller on fire")

    monkeypatch.setattr(prefetch, "read_segment_into", broken)

    def sampled_until_error() -> bool:
        store.sample(32, rng)
        return "prefetch" in store.thread_errors()

    wait_until(sampled_until_error, 20, "the prefetch error to be recorded", poll_s=0.001)
    assert store.thread_errors()["prefetch"] == "RuntimeError: disk controller on fire"
    assert store.stats()["thread_errors"] == store.thread_errors()
    monkeypatch.undo()
    swaps = store.prefetcher.swaps

    def swapped() -> bool:
        store.sample(32, rng)
        return store.prefetcher.swaps > swaps

    wait_until(swapped, 20, "the prefetcher to go on after the error", poll_s=0.001)
    store.close()


# -- lazy crc checks and the scrub -----------------------------------------------------------------


def test_open_reads_only_what_it_loads_and_the_scrub_finds_a_cold_corrupt_segment(tmp_path: Path, monkeypatch) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    a = Robot(1)
    for _ in range(40):
        writer.add(a, 60)
    store.close()
    segments = sorted(tmp_path.glob("seg-*.seg"))
    assert len(segments) >= 8
    cold = segments[1]  # old: never loaded into the small cache at open
    column = next(c for c in read_layout(cold)["columns"] if c["name"] == "obs/state")
    with open(cold, "r+b") as f:
        f.seek(column["offset"] + 40)
        byte = f.read(1)
        f.seek(column["offset"] + 40)
        f.write(bytes([byte[0] ^ 0x10]))
    bad = segment_transitions(cold)

    verified = []
    real_read = recovery.read_segment

    def counting_read(path, verify: bool = True):
        if verify:
            verified.append(Path(path).name)
        return real_read(path, verify=verify)

    monkeypatch.setattr(recovery, "read_segment", counting_read)
    store = open_store(tmp_path, ram_budget_mb=3.5 * SLOT_MB, scrub=False)
    print(f"{len(segments)} segments; crc checked at open: {verified}")
    assert len(verified) <= store.cache.slots and cold.name not in verified
    assert store.stats()["corrupt_segments"] == [] and store.stats()["scrub"]["verified"] < len(segments)
    store.close()
    monkeypatch.undo()

    store = open_store(tmp_path, ram_budget_mb=3.5 * SLOT_MB)  # with the background scrub
    wait_until(lambda: store.stats()["scrub"]["verified"] == store.stats()["scrub"]["total"], 30, "the scrub")
    assert [cold.name in c for c in store.stats()["corrupt_segments"]] == [True]
    assert {r.file: r.status for r in store.index.segments(status=None)}[cold.name] == "corrupt"
    assert store.stats()["scrub"]["total"] == len(segments)
    rng = np.random.default_rng(0)

    def sampled_through_rotations() -> bool:  # the prefetcher rotates the other segments through RAM
        assert not set(keys_of(store.sample(64, rng))) & bad, "a transition of the corrupt segment was sampled"
        return store.prefetcher.swaps >= 2 * len(segments)

    wait_until(sampled_through_rotations, 60, "the prefetcher to rotate segments", poll_s=0.002)
    store.close()


def test_a_discarded_episode_is_never_sampled_and_stays_discarded_across_a_restart(tmp_path: Path) -> None:
    """A person's re-record ends the episode with the discard mark: its rows stay on disk but no
    batch holds them, now or after the learner restarts."""
    store = open_store(tmp_path)
    writer, robot = Writer(store), Robot(1)
    writer.add(robot, episode_length(1, 0) + episode_length(1, 1) + 5)  # episodes 0, 1 end; 2 is at step 4
    store.commit()
    store.end_open_episodes(store.streams[("r1", 1)], reason=DISCARD)
    robot.episode, robot.step = 3, 0  # the edge starts the next episode
    writer.add(robot, 300)
    store.commit()

    def sampled_episodes(store) -> set[int]:
        return {episode for _, episode, _ in keys_of(store.sample(4096, np.random.default_rng(0)))}

    for reopened in (False, True):
        sampled = sampled_episodes(store)
        assert 2 not in sampled and {0, 1, 3, 4} <= sampled, (reopened, sorted(sampled))
        assert store.stats()["discarded_episodes"] == 1
        ep = {(e.stream, e.episode): e for e in store.index.episodes()}[(store.streams[("r1", 1)].record.id, 2)]
        assert (ep.status, ep.end_reason, ep.length) == ("truncated", DISCARD, 5)
        store.close()
        store = open_store(tmp_path)
    store.close()
