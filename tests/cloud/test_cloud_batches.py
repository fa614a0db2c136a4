"""The columns the learner sends an algorithm: exactly the ones it declares, with the
intervention flags derived from who acted (a person or the scripted intervener; not the policy,
not random warm-up)."""

from __future__ import annotations

import numpy as np
import pytest

from user_rl.algos import SAC, BehaviourCloning
from user_rl.cloud.batches import training_columns
from user_rl.wire import user_rl_pb2 as pb

WARMUP = 3  # ACTOR_WARMUP: random warm-up actions, neither the policy nor an intervention


def buffer_batch(actor: list[int], n_step: bool = False) -> dict[str, np.ndarray]:
    size = len(actor)
    batch = {
        "obs/state": np.zeros((size, 2), np.float32),
        "next_obs/state": np.ones((size, 2), np.float32),
        "action": np.zeros((size, 1), np.float32),
        "reward": np.zeros(size, np.float32),
        "terminated": np.zeros(size, bool),
        "policy_version": np.ones(size, np.int64),
        "robot": np.zeros(size, np.int64),
        "actor": np.array(actor, np.uint8),
        "policy_action": np.zeros((size, 1), np.float32),
    }
    if n_step:
        batch["discount"] = np.full(size, 0.9, np.float32)
    return batch


def test_sac_gets_the_columns_it_always_got() -> None:
    batch = buffer_batch([pb.ACTOR_POLICY, pb.ACTOR_HUMAN])
    assert (
        set(training_columns(batch))
        == set(training_columns(batch, SAC.batch_columns))
        == {"obs/state", "next_obs/state", "action", "reward", "terminated"}
    )
    assert set(training_columns(buffer_batch([0], n_step=True))) == {
        "obs/state",
        "next_obs/state",
        "action",
        "reward",
        "terminated",
        "discount",
    }


def test_behaviour_cloning_gets_intervention_flags_from_who_acted() -> None:
    batch = buffer_batch([pb.ACTOR_POLICY, pb.ACTOR_HUMAN, pb.ACTOR_SCRIPTED, WARMUP, pb.ACTOR_POLICY])
    columns = training_columns(batch, BehaviourCloning.batch_columns)
    assert set(columns) == {"obs/state", "action", "intervened", "policy_acted"}
    assert columns["intervened"].dtype == columns["policy_acted"].dtype == np.float32
    assert columns["intervened"].tolist() == [0, 1, 1, 0, 0]
    assert columns["policy_acted"].tolist() == [1, 0, 0, 0, 1]
    assert training_columns(batch, ("policy_action",))["policy_action"] is batch["policy_action"]


def test_a_column_the_buffer_does_not_give_is_an_error_naming_it() -> None:
    batch = buffer_batch([0, 1])
    del batch["actor"]
    with pytest.raises(
        ValueError,
        match="needs the batch column 'intervened' \\(derived from the actor column\\); "
        "the buffer's batch has action, next_obs/state",
    ):
        training_columns(batch, BehaviourCloning.batch_columns)
