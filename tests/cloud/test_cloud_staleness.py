"""Staleness control: rows from a policy that lagged the newest by more than `buffer.max_policy_lag`
versions are down-weighted or dropped as configured, counted per robot and shown in the status.

Real edge links to a real ingest; the lag is stamped as batches arrive and stored with the rows, so
a buffer reopened under another setting applies that one."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from tests.cloud.test_cloud_ingest import ACTION_SPACE, OBS_SPACE, wait_until, welcomed_link
from user_rl.cloud.buffer.store import AllStale, PersistentReplay
from user_rl.cloud.ingest import Ingest
from user_rl.config import BufferConfig
from user_rl.edge.batching import BatchBuilder
from user_rl.testing.wait import serving
from user_rl.wire import user_rl_pb2 as pb

MAX_LAG = 2
ROWS = 200  # per kind of row below
DRAWS = 40  # batches of 1000 sampled per setting


def episode_rows(policy_version: int, actor: int, first_episode: int, rows: int = ROWS) -> tuple[int, dict]:
    """`rows` steps in episodes of 10, each acted by `actor` with `policy_version`."""
    builder = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=rows)
    for i in range(rows):
        episode, step = first_episode + i // 10, i % 10
        obs = {"image": np.zeros((4, 4, 3), np.uint8), "state": np.full(3, step / 10, np.float32)}
        builder.add(
            obs,
            np.zeros(2, np.float32),
            0.0,
            False,
            step == 9,
            episode=episode,
            step=step,
            policy_version=policy_version,
            actor=actor,
            label=pb.LABEL_NONE,
            sensor_time=time.time(),
            final_obs=obs if step == 9 else None,
        )
    return builder.take()


def stale_share(buffer: PersistentReplay, seed: int = 0) -> float:
    """Share of sampled transitions that the lagging policy (version 1) acted."""
    rng = np.random.default_rng(seed)
    batches = [buffer.sample(1000, rng) for _ in range(DRAWS)]
    stale = [(b["policy_version"] == 1) & (b["actor"] == pb.ACTOR_POLICY) for b in batches]
    return float(np.mean(np.concatenate(stale)))


def test_rows_of_a_lagging_policy_are_counted_shown_and_weighted_as_configured(context: zmq.Context, tmp_path) -> None:
    settings = BufferConfig(max_policy_lag=MAX_LAG, stale_data="downweight", stale_weight=0.25)
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer", settings)
    for version in (1, 2, 3, 4, 5):
        ingest.publish(version)
    with serving(lambda: ingest.poll(50)) as crashed:
        fresh = welcomed_link(context, ingest, "edge-fresh", epoch=1)
        behind = welcomed_link(context, ingest, "edge-behind", epoch=1)
        try:
            fresh.send_batch(*episode_rows(5, pb.ACTOR_POLICY, 0))  # lag 0
            fresh.send_batch(*episode_rows(3, pb.ACTOR_POLICY, 20))  # lag 2: still used as is
            behind.send_batch(*episode_rows(-1, pb.ACTOR_WARMUP, 0))  # random warm-up: no policy lag
            behind.send_batch(*episode_rows(1, pb.ACTOR_POLICY, 20))  # lag 4: stale
            behind.send_batch(*episode_rows(1, pb.ACTOR_HUMAN, 40))  # a person acted: not the old policy's
            behind.heartbeat(pb.Heartbeat(env_steps=3 * ROWS, policy_version=1))
            wait_until(lambda: not fresh.unacked and not behind.unacked, pump=lambda: (fresh.poll(10), behind.poll(10)))
            wait_until(lambda: ingest.robots["edge-behind"].policy_lag is not None)
            robots = {rid: s.summary() for rid, s in ingest.robots.items()}
            assert robots["edge-behind"]["stale_transitions"] == ROWS
            assert robots["edge-behind"]["acting_version"] == 1 and robots["edge-behind"]["policy_lag"] == 4
            assert robots["edge-fresh"]["stale_transitions"] == 0
            assert ingest.report()["stale_transitions"] == ROWS
            downweighted = stale_share(ingest.buffer)
        finally:
            fresh.close()
            behind.close()
    ingest.close()
    assert not crashed, crashed

    def reopened(**changes) -> PersistentReplay:
        return PersistentReplay(tmp_path / "buffer", OBS_SPACE, ACTION_SPACE, settings.model_copy(update=changes))

    with_no_limit = reopened(max_policy_lag=None)
    try:
        lag = with_no_limit.sample(4000, np.random.default_rng(1))
        by_policy_v1 = (lag["policy_version"] == 1) & (lag["actor"] == pb.ACTOR_POLICY)
        assert by_policy_v1.any()
        raw = stale_share(with_no_limit)
    finally:
        with_no_limit.close()
    dropped = reopened(stale_data="drop")
    try:
        assert stale_share(dropped) == 0.0
    finally:
        dropped.close()
    # Five kinds of rows, 200 transitions each: a fifth are stale. Drawn a quarter as often as a fresh
    # one, their share is w p / (w p + 1 - p).
    assert raw == pytest.approx(0.2, abs=0.02)
    assert downweighted == pytest.approx(0.25 * raw / (0.25 * raw + 1 - raw), abs=0.015)


def test_a_buffer_of_only_dropped_rows_says_so_instead_of_sampling(context: zmq.Context, tmp_path) -> None:
    """The learner's batch thread waits on `AllStale` (batches.py) until fresh data comes."""
    ingest = Ingest(
        context, "tcp://127.0.0.1:0", tmp_path / "buffer", BufferConfig(max_policy_lag=0, stale_data="drop")
    )
    ingest.publish(1)
    ingest.publish(2)
    with serving(lambda: ingest.poll(50)) as crashed:
        link = welcomed_link(context, ingest, "edge-old", epoch=1)
        try:
            link.send_batch(*episode_rows(1, pb.ACTOR_POLICY, 0, rows=20))
            wait_until(lambda: not link.unacked, pump=lambda: link.poll(10))
            with pytest.raises(AllStale, match="max_policy_lag=0 versions"):
                ingest.buffer.sample(8, np.random.default_rng(0))
        finally:
            link.close()
    ingest.close()
    assert not crashed, crashed


def test_a_lag_counts_published_versions_not_version_numbers() -> None:
    """A restarted learner skips up to a block of numbers: the gap is no policy update."""
    from user_rl.cloud.staleness import PublishedVersions, row_lags

    published = PublishedVersions()
    for version in (7, 8, 101, 102):  # a restart between 8 and 101
        published.add(version)
    versions = np.array([8, 9, 101, 102, -1, 8])
    actor = np.array([pb.ACTOR_POLICY] * 4 + [pb.ACTOR_WARMUP, pb.ACTOR_HUMAN], np.uint8)
    np.testing.assert_array_equal(row_lags({"policy_version": versions, "actor": actor}, published), [2, 2, 1, 0, 0, 0])
    with pytest.raises(ValueError, match="only grow"):
        published.add(102)


LAGGING_LEARNER = """
import sys, threading, yaml
from pathlib import Path
from user_rl.cloud.learner import Learner
from user_rl.config import build_config
learner = Learner(build_config(yaml.safe_load(open(sys.argv[1]))), Path(sys.argv[2]))
threading.Thread(target=learner.run, daemon=True).start()
versions = [learner.pause()]                 # published; the checkpoint holds this one
learner.checkpoint_now()
learner.resume()
for _ in range(3):                           # published after the checkpoint, then the learner is killed
    versions.append(learner.pause())
    learner.resume()
print(" ".join(map(str, versions)), flush=True)
threading.Event().wait()                     # until SIGKILL
"""


def test_policy_lags_count_the_versions_published_before_a_learner_restart(tmp_path) -> None:
    """A learner publishes versions v1..v4 and is killed; the resumed one publishes v5. A spooled
    backlog acted by v1 then lags 4 versions (stale past max_policy_lag 2), one by v4 lags 1: the
    lag counts what the killed learner published, not only what the new one did."""
    import signal
    import subprocess
    import sys

    import yaml

    from tests.cloud.test_cloud_learner import REACH, Serving
    from user_rl.edge.link import DataLink
    from user_rl.hal.descriptor import DeviceDescriptor
    from user_rl.hal.registry import robot_spaces

    config = {**REACH, "buffer": {"max_policy_lag": MAX_LAG}}
    (tmp_path / "reach.yaml").write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", LAGGING_LEARNER, str(tmp_path / "reach.yaml"), str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    before = [int(v) for v in line.split()]
    assert len(before) == 4, line

    obs_space, action_space = robot_spaces("mujoco_reach", REACH["robot"]["options"])
    serving = Serving(tmp_path)
    context = zmq.Context()
    link = None
    try:
        learner = serving(config, run_dir)  # resumes from the checkpoint and publishes a fifth version
        assert learner.resumed_from["policy_version"] == before[0] and learner.version > before[-1]
        link = DataLink(
            context,
            learner.addresses["data"],
            DeviceDescriptor("sim", "mujoco_reach", "edge-0"),
            obs_space,
            action_space,
            epoch=1,
        )
        link.hello()
        wait_until(lambda: link.welcomed, 30, pump=lambda: link.poll(20))
        rows = 20
        for first_episode, version in ((0, before[0]), (2, before[-1])):
            builder = BatchBuilder(obs_space, action_space, capacity=rows)
            for i in range(rows):
                obs = obs_space.sample()
                builder.add(
                    obs,
                    action_space.sample(),
                    0.0,
                    False,
                    i % 10 == 9,
                    episode=first_episode + i // 10,
                    step=i % 10,
                    policy_version=version,
                    actor=pb.ACTOR_POLICY,
                    label=pb.LABEL_NONE,
                    sensor_time=time.time(),
                    final_obs=obs if i % 10 == 9 else None,
                )
            link.send_batch(*builder.take())
        link.heartbeat(pb.Heartbeat(env_steps=2 * rows, policy_version=before[0]))
        wait_until(lambda: not link.unacked, 30, pump=lambda: link.poll(10))
        robot = lambda: learner.ingest.robots["edge-0"].summary()  # noqa: E731
        wait_until(lambda: robot()["policy_lag"] is not None, 30)
        lag_counts = learner.ingest.report()["policy_lag_counts"]
        print(f"published {before} then {learner.version}; robot {robot()}; lag counts {lag_counts[:6]}")
        assert robot()["policy_lag"] == 4  # v2, v3, v4 before the restart and v5 after it
        assert lag_counts[4] == rows and lag_counts[1] == rows
        assert robot()["stale_transitions"] == rows  # only v1's rows lag more than max_policy_lag
    finally:
        if link is not None:
            link.close()
        serving.close()
        context.term()
