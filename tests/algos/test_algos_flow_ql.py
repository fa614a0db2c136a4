"""`flow_ql`, the full fine-tuning baseline next to steering: every weight of the flow moves, up the
chunk critic, and it is the critic (not the flow matching on its own chunks) that improves it."""

from __future__ import annotations

import pytest
import torch

from tests.algos.test_algos_steering import ACTION_SPACE, FLOW, OBS_SPACE, bandit_batch, bandit_return
from user_rl.algos import FlowQLSettings, make_algo


def fine_tune(q_weight: float, updates: int = 600, seed: int = 0) -> tuple[float, float, set[str]]:
    """The flow's bandit return before and after `updates` on its own chunks, and the parameters that
    stayed as they were."""
    torch.manual_seed(seed)
    settings = FlowQLSettings(critic_hidden=[64, 64], actor_lr=3e-4, critic_lr=1e-3, q_weight=q_weight)
    algo = make_algo("flow_ql", OBS_SPACE, ACTION_SPACE, "flow", FLOW, settings)
    before = {name: p.detach().clone() for name, p in algo.actor.named_parameters()}
    start = bandit_return(algo.actor)
    for _ in range(updates):
        batch = bandit_batch(algo)
        acted = torch.ones(len(batch["reward"]), FLOW["chunk"])
        algo.update({**batch, "chunk_policy_acted": acted, "chunk_intervened": torch.zeros_like(acted)})
    unchanged = {name for name, p in algo.actor.named_parameters() if torch.equal(before[name], p.detach())}
    return start, bandit_return(algo.actor), unchanged


def test_flow_ql_moves_every_weight_of_the_flow_up_the_critic() -> None:
    start, tuned, unchanged = fine_tune(q_weight=1.0)
    _, cloned_only, _ = fine_tune(q_weight=0.0)
    print(f"flow_ql: {start:.3f} -> {tuned:.3f}; flow matching on its own chunks alone: {cloned_only:.3f}")
    assert not unchanged
    assert tuned > start + 0.1 and tuned > cloned_only + 0.1


def test_flow_ql_refuses_a_flow_that_picks_among_chunks() -> None:
    with pytest.raises(ValueError, match="best_of 1"):
        make_algo("flow_ql", OBS_SPACE, ACTION_SPACE, "flow", {**FLOW, "best_of": 4})
