"""What a console tile shows beyond a robot page's state (tiles.py): recent success and intervention
rates, link health and policy lag, each counting what it says it counts."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from user_rl.edge.operator import StepRecord
from user_rl.edge.teleop.tiles import EPISODES, STEPS, TileTracker
from user_rl.wire import user_rl_pb2 as pb


def step(actor: int = pb.ACTOR_POLICY, ended: bool = False, label: int = pb.LABEL_NONE) -> StepRecord:
    zero = np.zeros(3, np.float32)
    return StepRecord({}, zero, zero, actor, 0.0, 0, 0, 0, ended, label, 0.0)


def edge(**link) -> SimpleNamespace:
    fields = dict(
        refused=None, handshake_error=None, connected=True, welcomed=True, unacked=0, reconnects=0, learner_version=-1
    )
    return SimpleNamespace(acting_version=-1, link=SimpleNamespace(**{**fields, **link}))


def test_the_intervention_rate_counts_people_and_the_scripted_expert_over_the_last_steps() -> None:
    tiles = TileTracker(edge())
    assert tiles.rates()["intervention_rate"] is None  # no step yet
    for actor in [pb.ACTOR_WARMUP] * 50 + [pb.ACTOR_HUMAN] * 30 + [pb.ACTOR_SCRIPTED] * 20 + [pb.ACTOR_POLICY] * 100:
        tiles.on_step(step(actor))
    assert tiles.rates()["intervention_rate"] == 0.25 and tiles.rates()["intervention_of"] == STEPS
    for _ in range(60):  # the warm-up steps and 10 of the person's leave the window
        tiles.on_step(step())
    assert tiles.rates()["intervention_rate"] == 0.2
    for _ in range(100):
        tiles.on_step(step())
    assert tiles.rates()["intervention_rate"] == 0.0


def test_the_success_rate_is_over_the_last_labelled_episodes() -> None:
    tiles = TileTracker(edge())
    assert tiles.rates()["success_rate"] is None
    for label in (pb.LABEL_SUCCESS, pb.LABEL_FAILURE, pb.LABEL_NONE, pb.LABEL_SUCCESS):
        tiles.on_step(step())  # a step that did not end its episode counts no episode
        tiles.on_step(step(ended=True, label=label))
    rates = tiles.rates()
    assert (rates["success_rate"], rates["success_of"], rates["episodes_ended"]) == (0.667, 3, 4)
    for _ in range(EPISODES):
        tiles.on_step(step(ended=True, label=pb.LABEL_FAILURE))
    assert tiles.rates()["success_rate"] == 0.0 and tiles.rates()["success_of"] == EPISODES


def test_link_health_and_policy_lag_are_what_the_edge_knows() -> None:
    assert TileTracker(edge(unacked=3)).link() == {"state": "ok", "backlog": 3, "reconnects": 0}
    assert TileTracker(edge(welcomed=False)).link()["state"] == "connecting"
    assert TileTracker(edge(connected=False, welcomed=False)).link()["state"] == "disconnected"
    assert TileTracker(edge(handshake_error="handshake_failed: ...")).link()["state"] == "handshake failing"
    assert TileTracker(edge(refused="spaces_mismatch: ...")).link()["state"] == "refused: spaces_mismatch: ..."

    warm = edge(learner_version=4)
    assert TileTracker(warm).policy() == {"acting": -1, "published": 4, "lag": None}  # random warm-up
    behind = edge(learner_version=7)
    behind.acting_version = 5
    assert TileTracker(behind).policy() == {"acting": 5, "published": 7, "lag": 2}
    behind.link.learner_version = -1  # nothing published yet (a local policy acts): not behind
    assert TileTracker(behind).policy()["lag"] == 0
