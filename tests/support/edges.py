"""An edge daemon with no learner behind it, for tests of what the edge does on its own."""

from __future__ import annotations

import zmq

from user_rl.edge.daemon import EdgeDaemon, EdgeSettings
from user_rl.policies import make_actor

NO_LEARNER = "tcp://127.0.0.1:1"  # nothing listens here: batches stay unacked, no weights arrive


def small_actor(robot):
    """A small MLP actor (hidden [16]) for `robot`'s spaces."""
    return make_actor("mlp", robot.observation_space, robot.action_space, hidden=[16])


def edge_without_learner(robot, settings: EdgeSettings, context: zmq.Context, actor=None) -> EdgeDaemon:
    """An edge daemon for `robot` whose data and weights addresses lead nowhere, acting with
    `actor` (a `small_actor` when none is given)."""
    return EdgeDaemon(robot, actor or small_actor(robot), NO_LEARNER, NO_LEARNER, settings, context)
