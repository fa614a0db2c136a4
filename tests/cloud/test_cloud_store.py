"""PersistentReplay on real files: what a learner relies on.

Every observation encodes (robot, episode, step) in its state and whether it is an episode's
final observation in its image, so a test can check each sampled (obs, next_obs) pair: the
same robot, the same episode, the next step; the final observation exactly when the episode
ended at that step; terminated only for real terminations. Segments are small (256 rows), so a
few hundred records span several sealed segments and pairs cross batch and segment boundaries.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import re
import signal
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from user_rl.cloud.buffer.rows import KIND_CARRY, row_bytes, segment_schema, successors
from user_rl.cloud.buffer.segment import read_layout, read_segment
from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.config import AttachConfig, BufferConfig
from user_rl.edge.batching import BatchBuilder
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import NEXT_OBS, OBS

OBS_SPACE = gym.spaces.Dict(
    {
        "image": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
        "state": gym.spaces.Box(-1e6, 1e6, (3,), np.float32),
    }
)
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
GAMMA = 0.9
Key = tuple[int, int, int]  # (robot, episode, step) of a transition's first observation


def settings(**kw) -> BufferConfig:
    """256-row segments; a RAM budget that holds everything unless a test says otherwise."""
    return BufferConfig(**{"segment_mb": 0.001, "ram_budget_mb": 2.0, **kw})


def open_store(directory: Path, **kw) -> PersistentReplay:
    return PersistentReplay(directory, OBS_SPACE, ACTION_SPACE, settings(**kw), gamma=GAMMA)


def episode_length(rid: int, episode: int) -> int:
    return 11 + (3 * rid + episode) % 5


def terminates(episode: int) -> bool:
    """Even episodes terminate; odd ones are cut by the time limit (truncated)."""
    return episode % 2 == 0


def reward_of(rid: int, step: np.ndarray) -> np.ndarray:
    return (np.asarray(step, np.float64) + 1) * 0.25 + rid


class Robot:
    """One stream of a deterministic robot; remembers every record it produced, in order."""

    def __init__(self, rid: int, episode: int = 0, step: int = 0) -> None:
        self.rid, self.episode, self.step = rid, episode, step
        self.version = 0
        self.actor = pb.ACTOR_POLICY
        self.emitted: list[tuple[int, int, bool]] = []  # (episode, step, episode ended here)
        self.versions: list[int] = []  # policy version of each emitted record

    def obs(self, episode: int, step: int, final: bool = False) -> dict[str, np.ndarray]:
        return {
            "image": np.full((4, 4, 3), int(final), np.uint8),
            "state": np.array([self.rid, episode, step], np.float32),
        }

    def batch(self, rows: int) -> dict[str, np.ndarray]:
        builder = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=rows)
        for _ in range(rows):
            e, s = self.episode, self.step
            ends = s == episode_length(self.rid, e) - 1
            term = ends and terminates(e)
            builder.add(
                self.obs(e, s),
                np.array([s / 1000, self.rid / 10], np.float32),
                float(reward_of(self.rid, s)),
                term,
                ends and not term,
                episode=e,
                step=s,
                policy_version=self.version,
                actor=self.actor,
                label=pb.LABEL_NONE,
                sensor_time=0.0,
                final_obs=self.obs(e, s + 1, final=True) if ends else None,
            )
            self.emitted.append((e, s, ends))
            self.versions.append(self.version)
            self.step += 1
            if ends:
                self.episode, self.step = e + 1, 0
        return builder.take()[1]

    def skip(self, steps: int = 1) -> None:
        """Lose `steps` records mid-episode (a gap)."""
        assert self.step + steps < episode_length(self.rid, self.episode) - 1
        self.step += steps

    def paired(self) -> set[Key]:
        """The records that have a next observation: the episode ended there, or the stream's
        next record is the same episode's next step."""
        out = set()
        for i, (e, s, ended) in enumerate(self.emitted):
            nxt = self.emitted[i + 1] if i + 1 < len(self.emitted) else None
            if ended or (nxt is not None and nxt[:2] == (e, s + 1)):
                out.add((self.rid, e, s))
        return out


class Writer:
    """Feeds a store with robots' batches; tracks seqs and the durable batch keys."""

    def __init__(self, store: PersistentReplay) -> None:
        self.store = store
        self.seq: dict[tuple[str, int], int] = {}
        self.keys: set[tuple[str, int, int]] = set()
        self.records = 0

    def add(self, robot: Robot, rows: int, epoch: int = 1, task: str = "reach") -> tuple[int, dict]:
        name = f"r{robot.rid}"
        stream = self.store.open_stream(name, epoch, task)
        seq = self.seq[(name, epoch)] = self.seq.get((name, epoch), 0) + 1
        cols = robot.batch(rows)
        assert self.store.add(stream, seq, cols)
        self.keys.add((name, epoch, seq))
        self.records += rows
        return seq, cols


def interleave(writer: Writer, robots: list[Robot], sizes: list[int], commit_every: int = 2, epoch: int = 1) -> None:
    for i, rows in enumerate(sizes):
        writer.add(robots[i % len(robots)], rows, epoch)
        if i % commit_every == commit_every - 1:
            writer.store.commit()
    writer.store.commit()


# -- checking transitions -------------------------------------------------------------------------


def keys_of(batch: dict[str, np.ndarray]) -> list[Key]:
    return [tuple(int(v) for v in row) for row in batch[OBS + "state"]]


def check_batch(batch: dict[str, np.ndarray], n_step: int = 1) -> np.ndarray:
    """Assert every row is a true transition of one episode; returns how many steps each spans."""
    s, ns = batch[OBS + "state"].astype(np.int64), batch[NEXT_OBS + "state"].astype(np.int64)
    rid, episode, step = s.T
    np.testing.assert_array_equal(ns[:, 0], rid, "next_obs of another robot")
    np.testing.assert_array_equal(ns[:, 1], episode, "next_obs of another episode")
    k = ns[:, 2] - step
    assert ((k >= 1) & (k <= n_step)).all(), f"next_obs is {sorted(set(k.tolist()))} steps ahead"
    last = ns[:, 2] - 1  # the step whose outcome ends the transition
    length = np.array([episode_length(int(r), int(e)) for r, e in zip(rid, episode)])
    ended = last == length - 1
    assert (batch[OBS + "image"][:, 0, 0, 0] == 0).all(), "a final observation was sampled as an obs"
    np.testing.assert_array_equal(
        batch[NEXT_OBS + "image"][:, 0, 0, 0] == 1,
        ended,
        "next_obs must be the final observation exactly when the episode ended",
    )
    expected_term = ended & np.array([terminates(int(e)) for e in episode])
    np.testing.assert_array_equal(batch["terminated"], expected_term, "terminated flag")
    np.testing.assert_array_equal(batch["action"][:, 0], (step / 1000).astype(np.float32), "action row")
    # Full n-step chains only stop early at an episode end (or a segment end, which tests allow).
    expected_reward = sum(
        np.where(i < k, GAMMA**i * reward_of(0, step + i) + GAMMA**i * rid, 0.0) for i in range(n_step)
    )
    np.testing.assert_allclose(batch["reward"], expected_reward, rtol=1e-5)
    if n_step > 1:
        np.testing.assert_allclose(batch["discount"], GAMMA**k, rtol=1e-5)
    return k


def cached_transitions(store: PersistentReplay) -> dict[str, np.ndarray]:
    """Every transition in RAM, as a sample would return it (n_step 1)."""
    cat = store.cache.catalog()
    pos = cat["position"]
    nxt = store.cache.successor(pos)
    flat = store.cache.flat
    out = {OBS + k: flat[OBS + k][pos] for k in ("image", "state")}
    out.update({NEXT_OBS + k: flat[OBS + k][nxt] for k in ("image", "state")})
    for name in ("action", "reward", "terminated"):
        out[name] = flat[name][pos]
    return out


def all_transitions(store: PersistentReplay) -> list[Key]:
    """All transitions of a store whose data fits in RAM, checked; sorted keys (duplicates kept)."""
    out = cached_transitions(store)
    assert len(out["reward"]) == len(store), "everything should be cached in this test"
    check_batch(out)
    return sorted(keys_of(out))


def segment_transitions(path: Path) -> set[Key]:
    seg = read_segment(path, verify=False)
    nxt = successors(np.asarray(seg.columns["prev_row"]), seg.rows)
    states = np.asarray(seg.columns[OBS + "state"])[nxt >= 0].astype(np.int64)
    return {tuple(int(v) for v in row) for row in states}


def open_files(directory: Path) -> set[str]:
    return {p.name for p in directory.glob("open-*")}


# -- 1. transition correctness -------------------------------------------------------------------


def test_pairs_are_consecutive_steps_across_batches_segments_and_episode_ends(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    a, b = Robot(1), Robot(2)
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 40, size=70).tolist()
    interleave(writer, [a, b], sizes[:30])
    before_gap = (2, *b.emitted[-1][:2])
    b.skip(1)  # one record of robot 2 is lost: only the pair across the gap disappears
    interleave(writer, [a, b], sizes[30:])

    segments = sorted(tmp_path.glob("seg-*.seg"))
    assert len(segments) >= 5
    carries = sum(int(np.count_nonzero(np.asarray(read_segment(p).columns["kind"]) == KIND_CARRY)) for p in segments)
    assert carries >= 3, "some episodes should continue across a sealed segment"

    expected = a.paired() | b.paired()
    pending = sum(not r.emitted[-1][2] for r in (a, b))  # a last record that waits for its successor
    assert len(expected) == writer.records - 1 - pending  # minus the record before the gap
    assert all_transitions(store) == sorted(expected)
    assert len(store) == len(expected) and store.records == writer.records
    assert store.stats()["dropped_unpaired"] == 1
    assert before_gap not in expected and (2, before_gap[1], before_gap[2] - 1) in expected

    rng = np.random.default_rng(1)
    seen, finals, truncs = set(), 0, 0
    for _ in range(20):
        batch = store.sample(256, rng)
        assert batch[OBS + "image"].dtype == np.uint8 and batch[NEXT_OBS + "state"].shape == (256, 3)
        check_batch(batch)
        final = batch[NEXT_OBS + "image"][:, 0, 0, 0] == 1
        finals += int(final.sum())
        truncs += int((final & ~batch["terminated"]).sum())
        seen.update(keys_of(batch))
    assert seen <= expected and len(seen) > 0.8 * len(expected)
    assert finals and truncs and finals > truncs, "both terminated and truncated episode ends were sampled"
    store.close()


def test_two_robots_with_the_same_episode_numbers_never_mix(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    robots = [Robot(3), Robot(3 + 5)]  # same episode lengths (3*rid mod 5), same steps, same episodes
    for _ in range(40):
        for r in robots:
            writer.add(r, 7)  # each robot's batches alternate with the other's, row for row
        store.commit()
    assert all_transitions(store) == sorted(robots[0].paired() | robots[1].paired())
    batch = store.sample(512, np.random.default_rng(0))
    check_batch(batch)
    assert set(np.unique(batch[OBS + "state"][:, 0]).tolist()) == {3, 8}
    store.close()


def test_batch_larger_than_a_segment_is_split_and_still_paired(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    a = Robot(0)
    writer.add(a, 5)
    writer.add(a, 700)  # several segments' worth in one batch
    writer.add(a, 3)
    store.commit()
    assert len(list(tmp_path.glob("seg-*.seg"))) >= 2
    assert all_transitions(store) == sorted(a.paired())
    assert len(store) == writer.records - 1
    store.close()
    store = open_store(tmp_path)
    assert all_transitions(store) == sorted(a.paired())
    assert store.batch_keys() == writer.keys
    store.close()


def test_empty_store_refuses_to_sample(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    with pytest.raises(ValueError, match="empty"):
        store.sample(4, np.random.default_rng(0))
    store.close()


# -- 2. durability and restart -------------------------------------------------------------------


def test_close_and_reopen_keeps_everything_and_streams_continue(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    a, b = Robot(1), Robot(2)
    interleave(writer, [a, b], [23, 17] * 15 + [5, 6])
    assert not a.emitted[-1][2] and not b.emitted[-1][2], "both robots stop mid-episode"
    before = all_transitions(store)
    stats = store.stats()
    store.close()
    assert not open_files(tmp_path)

    store = open_store(tmp_path)
    assert all_transitions(store) == before
    assert store.batch_keys() == writer.keys
    assert store.records == writer.records and len(store) == len(before)
    assert store.stats()["transitions"] == stats["transitions"]
    assert store.last_seq("r1", 1) == writer.seq[("r1", 1)]

    # A re-sent batch is refused; the next seq continues the episode across the restart.
    stream = store.open_stream("r1", 1, "reach")
    assert not store.add(stream, writer.seq[("r1", 1)], Robot(1).batch(3))
    assert not store.add(stream, 1, Robot(1).batch(3))
    assert store.stats()["duplicates"] == 2
    last = (1, *a.emitted[-1][:2])
    assert last not in before
    writer.store = store
    writer.add(a, 4)
    writer.add(b, 4)
    store.commit()
    now = all_transitions(store)
    assert last in now and (2, *b.emitted[-5][:2]) in now
    assert now == sorted(a.paired() | b.paired())
    store.close()

    store = open_store(tmp_path)
    assert all_transitions(store) == now
    assert store.batch_keys() == writer.keys and store.records == writer.records
    check_batch(store.sample(128, np.random.default_rng(0)))
    store.close()


def test_commit_reports_the_streams_that_advanced(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    a, b = Robot(1), Robot(2)
    assert store.commit() == []
    writer.add(a, 3)
    writer.add(a, 3)
    advanced = store.commit()
    assert [s.record.robot for s in advanced] == ["r1"] and advanced[0].durable_seq == 2
    writer.add(b, 3)
    writer.add(a, 3)
    assert sorted((s.record.robot, s.durable_seq) for s in store.commit()) == [("r1", 3), ("r2", 1)]
    assert store.commit() == []
    assert store.batch_keys() == writer.keys  # committed batches of the open segment count too
    store.close()


# -- 3. crash recovery ---------------------------------------------------------------------------

CRASH_SIZES = [30, 21, 27, 19] * 6


def committed(batches: int) -> tuple[Robot, Robot, set]:
    """The crashing writer's robots after its first `batches` batches, and their keys."""
    a, b = Robot(1), Robot(2)
    keys = set()
    for i, rows in enumerate(CRASH_SIZES[:batches]):
        robot = (a, b)[i % 2]
        robot.batch(rows)
        keys.add((f"r{robot.rid}", 1, i // 2 + 1))
    return a, b, keys


def crashing_writer(directory: str, uncommitted_rows: int) -> None:
    """Child process: commit batches, add one more without commit, die without closing."""
    store = open_store(Path(directory))
    writer = Writer(store)
    robots = [Robot(1), Robot(2)]
    interleave(writer, robots, CRASH_SIZES, commit_every=3)
    writer.add(robots[0], uncommitted_rows)  # r1's next batch: never acknowledged
    os.kill(os.getpid(), signal.SIGKILL)


def crash_while_sealing(directory: str) -> None:
    """Child process: die after a full segment is renamed into place, before the index knows it."""
    store = open_store(Path(directory))
    writer = Writer(store)
    register, seals = store.index.register_segment, []

    def dying_register(*args) -> None:
        seals.append(1)
        if len(seals) == 2:
            (Path(directory) / "batches-added").write_text(str(len(writer.keys)))
            os.kill(os.getpid(), signal.SIGKILL)
        register(*args)

    store.index.register_segment = dying_register
    interleave(writer, [Robot(1), Robot(2)], CRASH_SIZES, commit_every=3)
    os._exit(3)  # not reached


def run_child(target, *args) -> None:
    child = multiprocessing.get_context("fork").Process(target=target, args=args)
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("uncommitted_rows", [5, 200])  # fits the open segment / goes to a new one
def test_crash_keeps_exactly_the_committed_batches(tmp_path: Path, uncommitted_rows: int) -> None:
    run_child(crashing_writer, str(tmp_path), uncommitted_rows)
    assert open_files(tmp_path), "the crash left an open segment behind"
    sealed_before = {p.name for p in tmp_path.glob("seg-*.seg")}
    a, b, keys = committed(len(CRASH_SIZES))
    uncommitted = ("r1", 1, len(CRASH_SIZES) // 2 + 1)

    store = open_store(tmp_path)
    assert store.batch_keys() == keys
    assert open_files(tmp_path) == {f"open-{store.open_id:08d}.seg", f"open-{store.open_id:08d}.log"}
    assert sealed_before <= {p.name for p in tmp_path.glob("seg-*.seg")}
    assert all_transitions(store) == sorted(a.paired() | b.paired())
    assert store.records == sum(CRASH_SIZES)

    # The edges re-send what was not acknowledged; streams continue where the commits left them.
    writer = Writer(store)
    writer.seq = {("r1", 1): len(CRASH_SIZES) // 2, ("r2", 1): len(CRASH_SIZES) // 2}
    assert not store.add(store.open_stream("r1", 1), len(CRASH_SIZES) // 2, Robot(1).batch(2))
    last = (1, *a.emitted[-1][:2])
    assert last not in a.paired()
    assert writer.add(a, uncommitted_rows)[0] == uncommitted[2]  # the re-send is new data, not a duplicate
    writer.add(b, 6)
    store.commit()
    assert last in a.paired()
    assert all_transitions(store) == sorted(a.paired() | b.paired())
    store.close()
    store = open_store(tmp_path)
    assert store.batch_keys() == keys | writer.keys
    assert uncommitted in writer.keys
    assert not open_files(tmp_path) - {f"open-{store.open_id:08d}.seg", f"open-{store.open_id:08d}.log"}
    assert all_transitions(store) == sorted(a.paired() | b.paired())
    store.close()


def test_crash_while_sealing_keeps_the_segment(tmp_path: Path) -> None:
    run_child(crash_while_sealing, str(tmp_path))
    added = int((tmp_path / "batches-added").read_text())
    a, b, keys = committed(added)  # sealing commits everything added before it
    store = open_store(tmp_path)
    assert store.batch_keys() == keys
    assert all_transitions(store) == sorted(a.paired() | b.paired())
    assert open_files(tmp_path) == {f"open-{store.open_id:08d}.seg", f"open-{store.open_id:08d}.log"}
    assert len(list(tmp_path.glob("seg-*.seg"))) == 2 == len(store.index.segments())
    store.close()


# -- 4. corruption -------------------------------------------------------------------------------


def test_corrupt_and_truncated_segments_are_skipped(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    a, b = Robot(1), Robot(2)
    interleave(writer, [a, b], [25] * 60)
    store.close()
    segments = sorted(tmp_path.glob("seg-*.seg"))
    assert len(segments) >= 5
    per_segment = {p.name: segment_transitions(p) for p in segments}
    flipped, cut = segments[1], segments[-1]

    layout = read_layout(flipped)
    column = next(c for c in layout["columns"] if c["name"] == OBS + "state")
    with open(flipped, "r+b") as f:
        f.seek(column["offset"] + 100)
        byte = f.read(1)
        f.seek(column["offset"] + 100)
        f.write(bytes([byte[0] ^ 0x40]))
    os.truncate(cut, cut.stat().st_size // 2)
    cut_size = cut.stat().st_size

    store = open_store(tmp_path)
    corrupt = store.stats()["corrupt_segments"]
    assert len(corrupt) == 2
    assert any(flipped.name in c for c in corrupt) and any(cut.name in c for c in corrupt)
    good = set().union(*(t for name, t in per_segment.items() if name not in (flipped.name, cut.name)))
    assert set(all_transitions(store)) == good
    for _ in range(5):
        assert set(keys_of(store.sample(256, np.random.default_rng(0)))) <= good
    statuses = {r.file: r.status for r in store.index.segments(status=None)}
    assert statuses[flipped.name] == statuses[cut.name] == "corrupt"

    # Writing goes on into new segments; the damaged files are left as they are.
    writer.store = store
    interleave(writer, [Robot(5)], [60] * 12)
    store.close()
    assert cut.stat().st_size == cut_size
    store = open_store(tmp_path)
    check_batch(store.sample(256, np.random.default_rng(0)))
    assert len(store) == len(all_transitions(store))
    store.close()


# -- 5. edge restart -----------------------------------------------------------------------------


def test_new_epoch_ends_the_open_episode_and_never_pairs_across(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    writer = Writer(store)
    old = Robot(1)
    writer.add(old, episode_length(1, 0) + 4)  # episode 0 ends, episode 1 is open at step 3
    store.commit()
    assert old.emitted[-1] == (1, 3, False)

    new = Robot(1, episode=1, step=4)  # the restarted edge goes on numbering as if nothing happened
    store.end_finished_streams("r1", 2)  # its hello: epoch 1 is not spooled any more, its life is over
    writer.add(new, 5, epoch=2)
    store.commit()
    status = {(e.stream, e.episode): (e.status, e.end_reason) for e in store.index.episodes()}
    old_id = store.streams[("r1", 1)].record.id
    assert store.end_finished_streams("r1", 0) == []  # a stale epoch seen late ends nothing
    assert store.streams[("r1", 2)].episodes[1].status == "open"
    assert status[(old_id, 1)] == ("truncated", "edge_restart")
    assert status[(old_id, 0)] == ("terminated", "")
    keys = all_transitions(store)
    assert (1, 1, 3) not in keys and (1, 1, 4) in keys
    assert len(keys) == len(store) == writer.records - 2
    assert store.stats()["dropped_unpaired"] == 1
    store.close()

    store = open_store(tmp_path)
    status = {(e.stream, e.episode): (e.status, e.end_reason) for e in store.index.episodes()}
    assert status[(old_id, 1)] == ("truncated", "edge_restart")
    assert status[(store.streams[("r1", 2)].record.id, 1)] == ("open", "")
    assert all_transitions(store) == keys
    # A late batch of the old epoch (delayed on the network) never continues its ended episode.
    late = Robot(1, episode=1, step=4)
    assert store.add(store.open_stream("r1", 1), 2, late.batch(3))
    now = all_transitions(store)
    assert (1, 1, 3) not in now and now.count((1, 1, 4)) == 2  # one of each stream, each its own
    store.close()


# -- 6. n-step -----------------------------------------------------------------------------------


def test_n_step_returns_within_an_episode(tmp_path: Path) -> None:
    store = open_store(tmp_path, n_step=3)
    writer = Writer(store)
    a = Robot(1)
    for _ in range(15):
        writer.add(a, 13)
    store.commit()
    assert a.emitted[-1][2], "the stream ends with an episode: no chain is cut by a missing successor"
    assert not list(tmp_path.glob("seg-*.seg")), "one open segment: no segment boundary cuts a chain"
    batch = store.sample(4096, np.random.default_rng(0))
    k = check_batch(batch, n_step=3)
    step, episode = batch[OBS + "state"][:, 2], batch[OBS + "state"][:, 1]
    length = np.array([episode_length(1, int(e)) for e in episode])
    np.testing.assert_array_equal(k, np.minimum(3, length - step), "a chain stops only at the episode end")
    full = k == 3
    np.testing.assert_allclose(batch["discount"][full], GAMMA**3, rtol=1e-6)
    np.testing.assert_allclose(
        batch["reward"][full],
        reward_of(1, step[full]) + GAMMA * reward_of(1, step[full] + 1) + GAMMA**2 * reward_of(1, step[full] + 2),
        rtol=1e-5,
    )
    ended = batch[NEXT_OBS + "image"][:, 0, 0, 0] == 1
    assert (batch["terminated"][ended] == np.array([terminates(int(e)) for e in episode[ended]])).all()
    assert ended.any() and (ended & ~batch["terminated"]).any() and batch["terminated"].any()
    assert not batch["terminated"][~ended].any()

    for _ in range(40):  # now across sealed segments too: chains may be cut there, never wrong
        writer.add(a, 13)
    store.commit()
    assert len(list(tmp_path.glob("seg-*.seg"))) >= 2
    check_batch(store.sample(4096, np.random.default_rng(1)), n_step=3)
    store.close()


def test_action_chunks_are_the_next_actions_of_the_episode_with_who_executed_them(tmp_path: Path) -> None:
    """A chunk policy learns from each row's next H executed actions: they never cross an episode's
    end (masked there, repeating the last real action), and each says who executed it."""
    horizon = 4
    store = open_store(tmp_path, action_horizon=horizon)
    writer = Writer(store)
    a = Robot(1)
    for i in range(15):
        a.actor = pb.ACTOR_SCRIPTED if i % 3 == 0 else pb.ACTOR_POLICY  # who acted changes mid-episode
        writer.add(a, 13)
    store.commit()
    actors = {}
    for i in range(15):
        for e, s, _ in a.emitted[13 * i : 13 * (i + 1)]:
            actors[(e, s)] = pb.ACTOR_SCRIPTED if i % 3 == 0 else pb.ACTOR_POLICY
    batch = store.sample(4096, np.random.default_rng(0))
    check_batch(batch)
    step, episode = batch[OBS + "state"][:, 2].astype(int), batch[OBS + "state"][:, 1].astype(int)
    length = np.array([episode_length(1, e) for e in episode])
    chunk, mask = batch["action_chunk"], batch["chunk_mask"]
    assert chunk.shape == (4096, horizon, 2) and mask.shape == (4096, horizon)
    np.testing.assert_array_equal(mask, np.arange(horizon)[None] < np.minimum(horizon, length - step)[:, None])
    real = np.minimum(np.arange(horizon)[None], mask.sum(1)[:, None] - 1)  # a masked action repeats the last real one
    np.testing.assert_allclose(chunk[..., 0], ((step[:, None] + real) / 1000).astype(np.float32))
    np.testing.assert_array_equal(chunk[:, 0], batch["action"])
    expected_actor = np.array([[actors[(e, s + j)] for j in r] for e, s, r in zip(episode, step, real)])
    np.testing.assert_array_equal(batch["chunk_actor"], expected_actor)
    assert (batch["chunk_actor"] == pb.ACTOR_SCRIPTED).any() and (batch["chunk_actor"] == pb.ACTOR_POLICY).any()
    assert (~mask).any() and mask.all(1).any()
    np.testing.assert_array_equal(batch["chunk_step"], 0)  # these rows say nothing of chunks: a chunk of one
    store.close()


# -- 7. disk limit -------------------------------------------------------------------------------


def segment_bytes(tmp_path: Path) -> int:
    probe = open_store(tmp_path / "probe")
    Writer(probe).add(Robot(0), 300)
    probe.close()
    return max(p.stat().st_size for p in (tmp_path / "probe").glob("seg-*.seg"))


def test_disk_limit_evicts_oldest_online_segments_and_keeps_interventions(tmp_path: Path) -> None:
    size = segment_bytes(tmp_path)
    directory = tmp_path / "buf"
    store = open_store(directory, max_disk_gb=3.5 * size / 2**30)
    writer = Writer(store)
    a = Robot(1)
    cols_by_seq = {}
    for i in range(32):
        a.actor = pb.ACTOR_HUMAN if i == 10 else pb.ACTOR_POLICY  # in the third segment or so
        seq, cols = writer.add(a, 50)
        cols_by_seq[seq] = cols
        store.commit()
    records = {r.id: r for r in store.index.segments(status=None)}
    evicted = sorted(i for i, r in records.items() if r.status == "evicted")
    kept = sorted(i for i, r in records.items() if r.status == "ok")
    human = [i for i, r in records.items() if r.intervention_rows]
    assert len(records) >= 6 and human and evicted
    assert set(human) <= set(kept), "segments with human interventions are never evicted"
    assert evicted == [i for i in sorted(records) if i not in human][: len(evicted)], "oldest first"
    assert 1 not in human and len(kept) <= 3
    on_disk = {p.name for p in directory.glob("seg-*.seg")}
    assert on_disk == {records[i].file for i in kept}

    remaining = set().union(*(segment_transitions(directory / records[i].file) for i in kept))
    keys = all_transitions(store)
    assert remaining <= set(keys) <= a.paired()
    assert len(store) - sum(records[i].transitions for i in kept) < 256  # the open segment's
    assert (1, 0, 0) not in keys, "the oldest data is gone"
    human_key = (1, *a.emitted[525][:2])
    assert human_key in keys, "the human's data stays"
    assert set(keys_of(store.sample(512, np.random.default_rng(0)))) <= set(keys)
    assert store.records == writer.records

    # Evicted batches are still known: a re-send is a duplicate, not new data.
    assert store.batch_keys() == writer.keys
    assert not store.add(store.open_stream("r1", 1), 1, cols_by_seq[1])
    store.close()
    store = open_store(directory, max_disk_gb=3.5 * size / 2**30)
    assert store.batch_keys() == writer.keys
    assert not store.add(store.open_stream("r1", 1), 2, cols_by_seq[2])
    assert store.records == writer.records
    assert len(store) == len(all_transitions(store))
    store.close()


# -- 8. attached history -------------------------------------------------------------------------


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def history(directory: Path) -> tuple[Robot, Robot]:
    """An earlier run: robots 1 and 2, policy versions growing every batch."""
    store = open_store(directory)
    writer = Writer(store)
    a, b = Robot(1), Robot(2)
    for i in range(30):
        for r in (a, b):
            r.version = i
            writer.add(r, 20)
        store.commit()
    store.close()
    return a, b


def test_attached_history_is_filtered_mixed_and_left_untouched(tmp_path: Path) -> None:
    old = tmp_path / "old"
    a, b = history(old)
    before = snapshot(old)
    attach = AttachConfig(path=str(old), source="demo", robots=["r1"], min_policy_version=10)
    paired = a.paired()
    allowed = {(1, e, s) for (e, s, _), v in zip(a.emitted, a.versions) if v >= 10 and (1, e, s) in paired}

    store = open_store(tmp_path / "new", attach=[attach])
    assert set(all_transitions(store)) == allowed, "only robot r1's rows from policy version 10 on"
    online = Robot(7)
    writer = Writer(store)
    for _ in range(10):
        writer.add(online, 30)
    store.commit()
    assert len(store) == len(allowed) + writer.records - 1
    batch = store.sample(4000, np.random.default_rng(0))
    check_batch(batch)
    rid = batch[OBS + "state"][:, 0]
    assert set(keys_of(batch)) - set(online.paired()) <= allowed
    assert np.mean(rid == 1) == pytest.approx(len(allowed) / len(store), abs=0.04)  # uniform over both
    store.close()

    store = open_store(tmp_path / "mixed", attach=[attach], mix={"online": 0.5, "demo": 0.5})
    writer = Writer(store)
    writer.add(online, 40)
    store.commit()
    for seed in range(3):
        batch = store.sample(256, np.random.default_rng(seed))
        check_batch(batch)
        rid = batch[OBS + "state"][:, 0]
        assert np.count_nonzero(rid == 1) == 128 and np.count_nonzero(rid == 7) == 128
        assert set(keys_of(batch)) - set(online.paired()) <= allowed
    store.close()
    assert snapshot(old) == before, "attached history is read-only"

    # Other keys or shapes: refused, saying which; other bounds alone (a LeRobot dataset's stats): this run's apply.
    other = gym.spaces.Dict({"state": gym.spaces.Box(-1e6, 1e6, (4,), np.float32)})
    with pytest.raises(ValueError, match=re.escape(str(old))) as refused:
        PersistentReplay(tmp_path / "other", other, ACTION_SPACE, settings(attach=[attach]))
    assert "observation 'image' is there and not here" in str(refused.value)
    assert "observation 'state' is float32[3] there and float32[4] here" in str(refused.value)
    wider = gym.spaces.Box(-2.0, 2.0, ACTION_SPACE.shape, np.float32)
    store = PersistentReplay(tmp_path / "wider", OBS_SPACE, wider, settings(attach=[attach]))
    assert set(all_transitions(store)) == allowed
    store.close()
    assert snapshot(old) == before


# -- 9. RAM budget smaller than the data ---------------------------------------------------------


def test_ram_budget_smaller_than_the_data_rotates_segments(tmp_path: Path) -> None:
    slot_mb = 256 * row_bytes(segment_schema(OBS_SPACE, ACTION_SPACE)) / 2**20
    store = open_store(tmp_path, ram_budget_mb=2.5 * slot_mb)
    assert store.cache.slots == 2 + 1  # two slots and the prefetcher's spare
    writer = Writer(store)
    a, b = Robot(1), Robot(2)
    rng = np.random.default_rng(0)
    for i in range(60):  # writing and sampling at once, as a learner does
        writer.add((a, b)[i % 2], 30)
        store.commit()
        if i > 2:
            check_batch(store.sample(64, rng))
    expected = a.paired() | b.paired()
    assert len(store) == len(expected)
    segments = sorted(tmp_path.glob("seg-*.seg"))
    assert len(segments) >= 6
    where = {k: p.name for p in segments for k in segment_transitions(p)}

    names = {p.name for p in segments}
    seen = rotate(store, where, names, rng)
    assert seen <= expected
    store.close()
    segments = sorted(tmp_path.glob("seg-*.seg"))
    where = {k: p.name for p in segments for k in segment_transitions(p)}

    store = open_store(tmp_path, ram_budget_mb=2.5 * slot_mb)  # reopened: most data starts cold
    assert rotate(store, where, {p.name for p in segments}, rng) <= expected
    store.close()


def rotate(store: PersistentReplay, where: dict[Key, str], names: set[str], rng) -> set[Key]:
    """Sample (pausing, as a learner's update would) until every segment was sampled from."""
    sampled, seen = set(), set()
    deadline = time.monotonic() + 20
    for i in range(100_000):
        batch = store.sample(64, rng)
        check_batch(batch)
        seen.update(keys_of(batch))
        sampled.update(where[k] for k in keys_of(batch) if k in where)
        assert len(store.cache.active()) <= store.cache.slots - 1
        if (sampled == names and i >= 100) or time.monotonic() > deadline:
            break
        time.sleep(0.002)
    assert store.prefetcher.swaps > 0
    assert sampled == names, f"every sealed segment takes its turn in RAM; never sampled: {names - sampled}"
    return seen


def test_newest_sealed_segments_stay_in_ram(tmp_path: Path) -> None:
    slot_mb = 256 * row_bytes(segment_schema(OBS_SPACE, ACTION_SPACE)) / 2**20
    store = open_store(tmp_path, ram_budget_mb=5.5 * slot_mb, hot_segments=2)
    assert store.cache.slots == 5 + 1
    writer = Writer(store)
    a = Robot(1)
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(80):
        sealed = len(store.segments)
        writer.add(a, 40)
        store.commit()
        for _ in range(3):
            check_batch(store.sample(32, rng))
        cached = {store.cache.info[i].segment for i in store.cache.active()}
        newest = sorted(store.segments)[-2:]
        assert set(newest) <= cached, (newest, cached)
        checked += len(store.segments) > sealed
    assert checked >= 10
    store.close()


# -- 10. sampling strategies ---------------------------------------------------------------------


def test_task_balanced_gives_each_task_an_equal_share(tmp_path: Path) -> None:
    uniform = open_store(tmp_path / "u")
    balanced = open_store(tmp_path / "b", strategy="task_balanced")
    for store in (uniform, balanced):
        writer = Writer(store)
        a, b = Robot(1), Robot(2)
        for _ in range(12):
            writer.add(a, 45, task="reach")
            writer.add(b, 15, task="push")
        store.commit()
    for store, share in ((uniform, 0.25), (balanced, 0.5)):
        batch = store.sample(20_000, np.random.default_rng(0))
        check_batch(batch)
        assert np.mean(batch[OBS + "state"][:, 0] == 2) == pytest.approx(share, abs=0.02)
        store.close()
