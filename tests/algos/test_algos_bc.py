"""Behaviour cloning / HG-DAgger: the actor learns an expert's actions from the intervention rows
of mixed batches; the policy's own rows (and warm-up rows) change nothing unless weighted."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from user_rl.algos import BCSettings, BehaviourCloning, metrics_to_floats

OBS_SPACE = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (3,), np.float32)})
ACTION_SPACE = gym.spaces.Box(-2, 2, (2,), np.float32)  # non-unit bounds: scaling is exercised
EXPERT = np.array([[1.5, -1.0, 0.5], [0.0, 2.0, -1.0]], dtype=np.float32)  # |W s| reaches 3: clipped at times
TOLERANCE = 0.15  # largest error of the deterministic action over 500 held-out states, in action units (range 4)
MEAN_TOLERANCE = 0.02  # its mean over the states and both action components


def expert(state: np.ndarray) -> np.ndarray:
    return np.clip(state @ EXPERT.T, ACTION_SPACE.low, ACTION_SPACE.high)


def mixed_batch(
    rng: np.random.Generator, interventions: int = 128, policy_rows: int = 96, warmup_rows: int = 32
) -> dict:
    """Intervention rows carry the expert's action; policy and warm-up rows carry junk (uniform
    random actions). Rows are shuffled, as a buffer's sample would be."""
    size = interventions + policy_rows + warmup_rows
    state = rng.uniform(-1, 1, (size, 3)).astype(np.float32)
    kind = rng.permutation(np.repeat([0, 1, 2], [interventions, policy_rows, warmup_rows]))  # 0 intervened
    action = np.where((kind == 0)[:, None], expert(state), rng.uniform(-2, 2, (size, 2)).astype(np.float32))
    return {
        "obs": {"state": torch.from_numpy(state)},
        "action": torch.from_numpy(action),
        "intervened": torch.from_numpy((kind == 0).astype(np.float32)),
        "policy_acted": torch.from_numpy((kind == 1).astype(np.float32)),
    }


def only_interventions(batch: dict) -> dict:
    keep = batch["intervened"] > 0
    return {
        "obs": {k: v[keep] for k, v in batch["obs"].items()},
        "action": batch["action"][keep],
        "intervened": batch["intervened"][keep],
        "policy_acted": batch["policy_acted"][keep],
    }


def new_bc(policy_row_weight: float = 0.0, seed: int = 0) -> BehaviourCloning:
    torch.manual_seed(seed)
    return BehaviourCloning(
        OBS_SPACE,
        ACTION_SPACE,
        policy_options={"hidden": [64, 64]},
        settings=BCSettings(actor_lr=3e-3, policy_row_weight=policy_row_weight),
    )


def held_out_errors(bc: BehaviourCloning) -> np.ndarray:
    """|deterministic action - expert action| on 500 states never trained on."""
    state = np.random.default_rng(99).uniform(-1, 1, (500, 3)).astype(np.float32)
    chosen = bc.actor.act({"state": torch.from_numpy(state)}, deterministic=True).numpy()
    return np.abs(chosen - expert(state))


def test_hg_dagger_learns_the_expert_from_interventions_among_junk_rows() -> None:
    """Half of each batch is the expert's (interventions); the rest is random actions the policy
    or the warm-up took. Only the expert's actions are learned."""
    bc, rng = new_bc(), np.random.default_rng(0)
    for _ in range(3000):
        metrics = bc.update(mixed_batch(rng))
    errors = held_out_errors(bc)
    print(
        f"held-out action error: largest {errors.max():.4f} (tolerance {TOLERANCE}), mean {errors.mean():.4f} "
        f"(tolerance {MEAN_TOLERANCE}); last metrics {metrics_to_floats(metrics)}"
    )
    assert errors.max() < TOLERANCE and errors.mean() < MEAN_TOLERANCE
    assert metrics_to_floats(metrics)["imitated_rows"] == 128 and bc.updates == 3000


def test_rows_of_weight_zero_have_no_effect_and_weighted_policy_rows_do() -> None:
    rng = np.random.default_rng(1)
    batches = [mixed_batch(rng) for _ in range(30)]
    mixed, alone, weighted = new_bc(), new_bc(), new_bc(policy_row_weight=1.0)
    for batch in batches:
        mixed.update(batch)
        alone.update(only_interventions(batch))
        weighted.update(batch)
    for name, tensor in alone.state_dict()["actor"].items():
        assert torch.equal(mixed.state_dict()["actor"][name], tensor), f"{name}: the junk rows changed the policy"
    differs = [
        name
        for name, tensor in alone.state_dict()["actor"].items()
        if not torch.equal(weighted.state_dict()["actor"][name], tensor)
    ]
    assert differs, "policy_row_weight=1 did not let the policy's own rows count"
    assert torch.equal(weighted.row_weights(batches[0]), batches[0]["intervened"] + batches[0]["policy_acted"])


def test_a_batch_without_interventions_changes_nothing() -> None:
    """Not even through Adam's momentum, which would move the weights on a zero gradient."""
    bc, rng = new_bc(), np.random.default_rng(2)
    for _ in range(5):
        bc.update(mixed_batch(rng))
    before = {name: tensor.clone() for name, tensor in bc.actor.state_dict().items()}
    metrics = metrics_to_floats(bc.update(mixed_batch(rng, interventions=0)))
    assert metrics["imitated_rows"] == 0 and bc.updates == 6
    for name, tensor in bc.actor.state_dict().items():
        assert torch.equal(tensor, before[name]), name
