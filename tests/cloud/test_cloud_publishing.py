"""Fresh weights on the edge (issue 34): the learner publishes by time, capped by bytes, not every
fixed count of updates, and measures each row's policy lag in updates.

The schedule and the lag counter on their own; then the real trainer process handing actors back
on a clock, and a real learner with a real sim edge, where publishing by time keeps the rows'
lag in updates far below publishing every 100 updates."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from tests.cloud.test_cloud_learner import REACH, Serving
from tests.cloud.test_cloud_trainer import batches, post_all, replies_until_state, spec
from user_rl.algos import SAC
from user_rl.cloud.actor_buffers import ActorBuffers
from user_rl.cloud.publish_schedule import PublishSchedule
from user_rl.cloud.staleness import UpdateLags
from user_rl.cloud.threads import GuardedThread
from user_rl.cloud.trainer import Trainer
from user_rl.config import build_config
from user_rl.edge.factory import make_edge
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb


# -- the schedule -------------------------------------------------------------------------------
def test_the_first_actor_goes_at_once_then_one_every_period() -> None:
    schedule = PublishSchedule(every_s=0.1, every_updates=None, max_bytes_per_s=None)
    assert schedule.due(1, now=0.0)
    schedule.published(1, 0.0)
    assert not schedule.due(5, now=0.09)
    assert schedule.due(6, now=0.1)
    schedule.published(6, 0.1)
    assert not schedule.due(6, now=5.0), "no update since the last version: nothing new to send"


def test_every_updates_publishes_at_each_multiple_and_catches_up_a_missed_one() -> None:
    schedule = PublishSchedule(every_s=None, every_updates=50, max_bytes_per_s=None)
    schedule.published(1, 0.0)
    assert [u for u in range(2, 120) if schedule.due(u, now=0.0)][:1] == [50]
    schedule.published(1, 0.0)
    assert schedule.due(57, now=0.0), "a multiple passed while the actor could not be written: it goes now"
    schedule.published(57, 0.0)
    assert not schedule.due(99, now=0.0) and schedule.due(100, now=0.0)


def test_a_big_actor_goes_out_no_faster_than_the_byte_cap() -> None:
    """A 200 MB actor at 20 MB/s: one version every 10 s, however often time or updates ask."""
    schedule = PublishSchedule(every_s=0.1, every_updates=5, max_bytes_per_s=20e6, actor_bytes=200_000_000)
    schedule.published(1, 0.0)
    assert schedule.min_interval_s == 10.0
    assert not schedule.due(500, now=9.9)
    assert schedule.due(500, now=10.0)


def test_a_config_that_would_never_publish_is_refused_saying_what_to_set() -> None:
    with pytest.raises(ValueError, match="publish_every_s and publish_every_updates are both null"):
        build_config({**REACH, "learner": {"publish_every_s": None}})


# -- lags in updates --------------------------------------------------------------------------------
def rows(versions: list[int], actor: int = pb.ACTOR_POLICY) -> dict[str, np.ndarray]:
    return {"policy_version": np.array(versions, np.int64), "actor": np.full(len(versions), actor, np.uint8)}


def test_a_rows_lag_is_the_updates_made_since_its_version() -> None:
    lags = UpdateLags()
    lags.published(7, updates=100)
    lags.published(8, updates=130)
    lags.add(rows([7, 7, 8, 8]), updates_now=140)
    lags.add(rows([8, 8], actor=pb.ACTOR_HUMAN), updates_now=140)  # a person acted: no policy lag
    lags.add(rows([3]), updates_now=140)  # an earlier learner's version: not known here
    report = lags.report()
    assert report["rows"] == 4 and report["max"] == 40 and report["p50"] == 25.0 and report["unknown"] == 1


def test_the_lag_window_and_the_versions_kept_are_bounded() -> None:
    lags = UpdateLags()
    lags.MAX_VERSIONS, lags.WINDOW = 8, 5
    lags.__init__()  # the arrays at the smaller sizes
    for version in range(1, 21):
        lags.published(version, updates=10 * version)
    assert len(lags._versions) == 8
    lags.add(rows([20] * 3 + [19] * 4), updates_now=200)  # lags 0, 0, 0, 10, 10, 10, 10: the window keeps 5
    assert lags.report() == {"rows": 5, "p50": 10.0, "p90": 10.0, "p99": 10.0, "max": 10, "mean": 8.0, "unknown": 0}
    lags.add(rows([1]), updates_now=200)  # forgotten long ago: counted as unknown, not as a wrong number
    assert lags.report()["unknown"] == 1


# -- the trainer process ------------------------------------------------------------------------------
def actor_bytes() -> int:
    s = spec()
    return ActorBuffers(SAC(s.obs_space, s.action_space, "mlp", s.policy_options).actor, count=1).own_layout.total_bytes


def handed_back(**publishing) -> tuple[list[int], float]:
    """The updates of each actor a trainer hands back while 60 batches come in over about a second,
    and the seconds that took."""
    trainer = Trainer(spec(publish_every_updates=None, **publishing), depth=3)
    try:
        started = time.monotonic()
        for batch in batches(60):
            post_all(trainer, [batch])
            time.sleep(0.01)
        actors, _ = replies_until_state(trainer)
        return [a.updates for a in actors], time.monotonic() - started
    finally:
        trainer.close()


def test_the_trainer_hands_the_actor_back_on_a_clock_and_a_big_one_slower() -> None:
    for publishing, period in (
        ({"publish_every_s": 0.05}, 0.05),
        ({"publish_every_s": 0.05, "publish_max_bytes_per_s": actor_bytes() / 0.3}, 0.3),  # one per 0.3 s at most
    ):
        updates, elapsed = handed_back(**publishing)
        assert updates[0] == 1 and updates == sorted(updates)
        # at most one version a period (and the first); a loaded machine only makes fewer
        assert 2 <= len(updates) <= elapsed / period + 2, (publishing, updates, elapsed)


# -- a learner and a real edge ------------------------------------------------------------------------
def lag_in_updates(tmp_path: Path, learner_settings: dict) -> dict:
    """The learner's report of its rows' policy lag in updates, once a real reach edge, paced to the
    learner (one update per env step, as sims train), has been acting with its policy for 700 updates."""
    config = {
        **REACH,
        "fleet": {"num_robots": 1, "pace_to_learner": True, "batch_transitions": 16},
        "learner": {**REACH["learner"], **learner_settings},
    }
    cfg = build_config(config)
    serving = Serving(tmp_path)
    learner = serving(config, tmp_path / f"run-{len(list(tmp_path.iterdir()))}")
    edge = make_edge(cfg, 0, learner.addresses["data"], learner.addresses["weights"], tmp_path / "spool")
    runner = GuardedThread("edge", edge.run)
    runner.start()
    try:
        wait_until(lambda: learner.updates >= 800, 240, "800 updates")
        return learner.status()["policy_lag_updates"] | {"versions": learner.version, "updates": learner.updates}
    finally:
        edge.stop()
        runner.join(30)
        edge.close()
        serving.close()


def test_publishing_by_time_keeps_the_rows_lag_in_updates_small(tmp_path: Path) -> None:
    """Every 0.05 s against every 200 updates: the p50 lag of the rows the policy acted, in updates,
    is a fraction of the fixed count's (about 100 by construction: a row's version is 0 to 200 updates
    old when the next comes out). Paced, the updates and the edge's steps go at one rate, so a
    loaded machine slows both alike; by time the lag is about a batch of steps' updates (the edge
    acts a batch of 16 with one version, the learner then makes their 16 updates)."""
    by_time = lag_in_updates(tmp_path, {"publish_every_s": 0.05})
    by_count = lag_in_updates(tmp_path, {"publish_every_s": None, "publish_every_updates": 200})
    print(f"lag in updates, published every 0.05 s: {by_time}; every 200 updates: {by_count}")
    for report in (by_time, by_count):
        assert report["p50"] <= report["p90"] <= report["p99"] <= report["max"]
    assert by_count["p50"] >= 60
    assert by_time["p50"] < by_count["p50"] / 2
