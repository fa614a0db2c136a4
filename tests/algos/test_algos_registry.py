"""The algorithm registry: `algo.type` names one of its algorithms (else a config error that lists
them); each builds from the config's fields, trains on the columns the learner sends it, and
continues from its state exactly."""

from __future__ import annotations

import copy
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.support.batches import algorithm_batch, buffer_batch
from user_rl.algos import ALGOS, AlgoSettings, BCSettings, SACSettings, algo_settings, make_algo, metrics_to_floats
from user_rl.config import ConfigError, build_config

OBS_SPACE = gym.spaces.Dict(
    {"image": gym.spaces.Box(0, 255, (24, 24, 3), np.uint8), "state": gym.spaces.Box(-1, 1, (4,), np.float32)}
)
ACTION_SPACE = gym.spaces.Box(-1, 1, (3,), np.float32)
METRICS = {
    "sac": {"critic_loss", "actor_loss", "alpha", "q"},
    "drq": {"critic_loss", "actor_loss", "alpha", "q"},
    "bc": {"bc_loss", "action_nll", "action_mse", "imitated_rows"},
    "qc": {"critic_loss", "flow_loss", "q"},
    "dsrl": {"critic_loss", "actor_loss", "noise_critic_loss", "alpha", "q"},
    "residual": {"critic_loss", "actor_loss", "alpha", "q"},
    "flow_ql": {"critic_loss", "flow_loss", "q", "q_own"},
}
CHUNK = 2
# the policy each algorithm is tested with (qc needs a flow chunk policy with a critic to choose;
# dsrl and residual steer a chunk policy)
POLICIES = {
    "qc": ("flow", {"chunk": CHUNK, "flow_steps": 2, "best_of": 3}),
    "dsrl": ("flow", {"chunk": CHUNK, "flow_steps": 2}),
    "residual": ("flow", {"chunk": CHUNK, "flow_steps": 2}),
    "flow_ql": ("flow", {"chunk": CHUNK, "flow_steps": 2}),
}
POLICY_CONFIG = {
    "qc": {"type": "flow", "chunk": CHUNK, "best_of": 3},
    "dsrl": {"type": "flow", "chunk": CHUNK},
    "residual": {"type": "flow", "chunk": CHUNK},
    "flow_ql": {"type": "flow", "chunk": CHUNK},
}


def algo_config(name: str, **settings) -> dict:
    return {"algo": {"type": name, **settings}, **({"policy": POLICY_CONFIG[name]} if name in POLICY_CONFIG else {})}


def build(name: str, seed: int):
    torch.manual_seed(seed)
    policy, options = POLICIES.get(name, ("mlp", {}))
    return make_algo(name, OBS_SPACE, ACTION_SPACE, policy, {"hidden": [32], **options})


def learner_batch(name: str, rng: np.random.Generator) -> dict:
    """What the trainer process hands the algorithm: its own columns of a sampled batch, as tensors."""
    return algorithm_batch(buffer_batch(OBS_SPACE, ACTION_SPACE, rng, chunk=CHUNK), ALGOS[name].batch_columns)


def test_an_unknown_algo_type_is_a_config_error_that_names_the_choices() -> None:
    with pytest.raises(
        ConfigError,
        match=re.escape("config error: algo.type: unknown algorithm; known: sac, drq, bc, qc, dsrl, residual, flow_ql")
        + ".*"
        + re.escape("the entry-point group 'user_rl.algos' (got 'ppo')"),
    ):  # plugins, if any, after the built-ins
        build_config({"algo": {"type": "ppo"}})
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'; known: sac, drq, bc, qc, dsrl, residual, flow_ql"):
        make_algo("ppo", OBS_SPACE, ACTION_SPACE)


def test_a_setting_of_another_algorithm_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError, match="algo.policy_row_weight is a setting of algo.type bc, qc or flow_ql; this algo's type is sac"
    ):
        build_config({"algo": {"policy_row_weight": 0.5}})
    with pytest.raises(
        ConfigError, match="algo.critic_layer_norm is a setting of algo.type sac or drq; this algo's type is bc"
    ):
        build_config({"algo": {"type": "bc", "critic_layer_norm": True}})
    with pytest.raises(ConfigError, match="algo.policy_row_weight: Input should be greater than or equal to 0"):
        build_config({"algo": {"type": "bc", "policy_row_weight": -1}})


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_every_setting_comes_from_the_config_by_name(name: str) -> None:
    """The config's algo section is the algorithm's own Settings (what the learner hands it)."""
    cfg = build_config(algo_config(name, actor_lr=1e-3))
    assert issubclass(algo_settings(name), AlgoSettings)
    assert type(cfg.algo) is ALGOS[name].Settings and cfg.algo.actor_lr == 1e-3


def test_the_configs_settings_reach_each_algorithm() -> None:
    sac = build_config({"algo": {"critic_layer_norm": True, "tau": 0.01}}).algo
    assert sac == SACSettings(tau=0.01, critic_layer_norm=True)
    bc = build_config({"algo": {"type": "bc", "policy_row_weight": 0.25}}).algo
    assert bc == BCSettings(policy_row_weight=0.25)
    with pytest.raises(TypeError, match="algorithm 'bc' takes BCSettings, not SACSettings"):
        make_algo("bc", OBS_SPACE, ACTION_SPACE, settings=SACSettings())


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_each_algorithm_trains_and_continues_exactly_from_its_state(name: str) -> None:
    rng = np.random.default_rng(0)
    batches = [learner_batch(name, rng) for _ in range(3)]
    algo = build(name, 0)
    metrics = metrics_to_floats(algo.update(batches[0]))
    print(f"{name}: {metrics}")
    assert set(metrics) == METRICS[name] and np.isfinite(list(metrics.values())).all()
    state = copy.deepcopy(algo.state_dict())  # as a checkpoint holds it (a live state_dict shares its tensors)
    assert state["algo"] == name and "actor" in state  # the learner publishes state["actor"] on resume

    clone = build(name, 1)  # another initialisation: everything must come from the state
    clone.load_state_dict(state)
    assert clone.updates == algo.updates == 1
    for batch in batches[1:]:  # networks and optimisers alike: the same next steps
        torch.manual_seed(2)
        algo.update(batch)
        torch.manual_seed(2)
        clone.update(batch)
    for key, tensor in algo.actor.state_dict().items():
        assert torch.equal(clone.actor.state_dict()[key], tensor), key
    obs = batches[0]["obs"]
    torch.manual_seed(3)
    action = algo.actor.act(obs, deterministic=True)
    torch.manual_seed(3)  # best-of-N samples even when deterministic
    assert torch.equal(action, clone.actor.act(obs, deterministic=True)) and action.shape == (16, 3)


def test_a_state_of_another_algorithm_is_refused_with_a_clear_error() -> None:
    bc_state = make_algo("bc", OBS_SPACE, ACTION_SPACE, policy_options={"hidden": [32]}).state_dict()
    sac = make_algo("sac", OBS_SPACE, ACTION_SPACE, policy_options={"hidden": [32]})
    with pytest.raises(ValueError, match="written by algorithm 'bc', not 'sac': set algo.type: bc to continue it"):
        sac.load_state_dict(bc_state)
    old_sac_state = {k: v for k, v in sac.state_dict().items() if k != "algo"}  # before the registry
    sac.load_state_dict(old_sac_state)
    with pytest.raises(ValueError, match="written by algorithm 'sac', not 'bc'"):
        make_algo("bc", OBS_SPACE, ACTION_SPACE, policy_options={"hidden": [32]}).load_state_dict(old_sac_state)
