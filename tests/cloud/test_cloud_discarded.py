"""Discarded (re-recorded) episodes on a real learner: they do not count toward
`algo.learning_starts` (only rows the sampler may draw do), and a buffer with nothing to draw in
RAM makes training wait, never stops the learner's sampler thread."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq

from tests.cloud.test_cloud_ingest import wait_until
from tests.cloud.test_cloud_learner import REACH, Serving
from user_rl.edge.batching import BatchBuilder
from user_rl.edge.link import DataLink
from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.hal.registry import robot_spaces
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import DISCARD

SPACES = robot_spaces("mujoco_reach", REACH["robot"]["options"])


def steps(episode: int, count: int, actor: int = pb.ACTOR_WARMUP) -> tuple[int, dict]:
    """`count` steps of one episode that is still going on (its end comes as a marker or not at all)."""
    obs_space, action_space = SPACES
    builder = BatchBuilder(obs_space, action_space, capacity=count)
    for step in range(count):
        builder.add(
            obs_space.sample(),
            action_space.sample(),
            0.0,
            False,
            False,
            episode=episode,
            step=step,
            policy_version=-1,
            actor=actor,
            label=pb.LABEL_NONE,
            sensor_time=time.time(),
        )
    return builder.take()


class Edge:
    """A real edge link to the learner's data port."""

    def __init__(self, context: zmq.Context, learner) -> None:
        self.link = DataLink(
            context, learner.addresses["data"], DeviceDescriptor("sim", "mujoco_reach", "edge-0"), *SPACES, epoch=1
        )
        try:
            self.link.hello()
            wait_until(lambda: self.link.welcomed, 30, pump=lambda: self.link.poll(20))
        except BaseException:
            self.link.close()
            raise

    def acked(self) -> None:
        wait_until(lambda: not self.link.unacked, 30, pump=lambda: self.link.poll(10))


@contextmanager
def learner_with_edge(tmp_path: Path, config: dict) -> Iterator[tuple]:
    """A real learner serving `config`, its loop thread, and a real edge link to it; all closed after."""
    serving, context = Serving(tmp_path), zmq.Context()
    edge = None
    try:
        learner = serving(config)
        edge = Edge(context, learner)
        yield learner, serving.loop_of(learner), edge
    finally:
        if edge is not None:
            edge.link.close()
        serving.close()
        context.term()


def test_discarded_rows_do_not_start_learning_and_an_empty_draw_never_stops_the_sampler(tmp_path: Path) -> None:
    config = {**REACH, "algo": {**REACH["algo"], "learning_starts": 30, "batch_size": 8}}
    with learner_with_edge(tmp_path, config) as (learner, loop, edge):
        # Below learning_starts even before its discard arrives (the two are separate messages).
        edge.link.send_batch(*steps(0, 25))
        edge.link.send_episode_end(DISCARD)  # a person re-records: its 24 transitions leave the catalog
        edge.acked()
        wait_until(lambda: learner.buffer.stats()["discarded_episodes"] == 1, 30)
        assert len(learner.buffer) == 0  # nothing sampleable
        edge.link.send_batch(*steps(1, 20))  # 19 sampleable: with the discarded 24, past learning_starts
        edge.acked()
        wait_until(lambda: len(learner.buffer) == 19, 30)
        time.sleep(1.0)  # the sampler thread's turns: it must neither start learning nor die
        assert loop.is_alive() and not learner.status()["errors"], (loop.error, learner.status()["errors"])
        assert learner.updates == 0 and learner.sampler.prepared == 0
        edge.link.send_batch(*steps(2, 20))  # 19 + 19 sampleable transitions: past learning_starts
        edge.acked()
        wait_until(lambda: learner.updates > 0, 60)
        assert loop.is_alive() and not learner.status()["errors"]


def test_a_mix_with_nothing_in_ram_to_draw_makes_training_wait_not_stop(tmp_path: Path) -> None:
    """The mix asks for demonstrations only; the RAM holds online rows: each draw finds nothing.
    The sampler thread waits (and says so in the log) until demonstrations arrive."""
    config = {
        **REACH,
        "algo": {**REACH["algo"], "learning_starts": 10, "batch_size": 8},
        "buffer": {"mix": {"intervention": 1.0}},
    }
    with learner_with_edge(tmp_path, config) as (learner, loop, edge):
        edge.link.send_batch(*steps(0, 40))
        edge.acked()
        wait_until(lambda: len(learner.buffer) == 39, 30)
        time.sleep(1.5)  # many turns of the sampler thread, each finding nothing to draw
        assert loop.is_alive() and not learner.status()["errors"], (loop.error, learner.status()["errors"])
        assert learner.updates == 0 and learner.sampler.empty_waits > 0
        edge.link.send_batch(*steps(1, 40, actor=pb.ACTOR_HUMAN))  # a person drives: intervention rows
        edge.acked()
        wait_until(lambda: learner.updates > 0, 60)
        assert loop.is_alive() and not learner.status()["errors"]
