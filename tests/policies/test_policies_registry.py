"""Adding a built-in policy: its own module and one line in `user_rl.policies.ACTORS`, nothing else.

The settings of a policy type live with its actor (`Settings`), and what the config checks across
sections (which algorithms train it) comes from what the classes declare. So a new policy touches
2 files: its module and the registry (before issue 30: the config's PolicyConfig fields, ONLY_FOR
table and options(), the BUILTIN_POLICIES copy and the config's algorithm check: 4 files).
"""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from user_rl.algos import make_algo
from user_rl.config import ConfigError, build_config
from user_rl.policies import ACTORS, make_actor

# What would be user_rl/policies/scaled.py: the module, complete.
NEW_POLICY_MODULE = """
from pydantic import Field

from user_rl.config import PolicySettings
from user_rl.policies import GaussianActor


class ScaledSettings(PolicySettings):
    type: str = "scaled"
    width: int = Field(32, ge=1, description="the one hidden layer's width")
    gain: float = Field(1.0, gt=0.0, description="the mean's scale before the tanh")


class ScaledActor(GaussianActor):
    Settings = ScaledSettings

    def __init__(self, obs_space, action_space, width: int, gain: float) -> None:
        super().__init__(obs_space, action_space, [width])
        self.gain = gain
"""
OBS = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (3,), np.float32)})
ACT = gym.spaces.Box(-1, 1, (2,), np.float32)


def test_a_new_policy_is_its_module_and_one_registration_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "user_rl_scaled_policy.py").write_text(NEW_POLICY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(ACTORS, "scaled", "user_rl_scaled_policy:ScaledActor")  # the one line in ACTORS

    cfg = build_config({"policy": {"type": "scaled", "gain": 2.0}, "algo": {"type": "bc"}})
    assert cfg.policy.options() == {"width": 32, "gain": 2.0}  # its own keys, its own defaults
    actor = make_actor(cfg.policy.type, OBS, ACT, **cfg.policy.options())
    assert type(actor).__name__ == "ScaledActor" and actor.gain == 2.0
    bc = make_algo("bc", OBS, ACT, cfg.policy.type, cfg.policy.options(), cfg.algo)
    assert type(bc.actor).__name__ == "ScaledActor"
    for overrides, message in (  # its settings are checked like a built-in's, with the same one-line errors
        (["policy.gain=0"], "config error: policy.gain: Input should be greater than 0 (got 0)"),
        (["policy.hidden=[8]"], "config error: policy.hidden is a setting of policy.type mlp, flow or vla"),
        (["policy.width=8", "policy.type=mlp"], "config error: policy.width is a setting of policy.type scaled;"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            build_config({"policy": {"type": "scaled"}}, overrides)
    # A step policy: the config's algorithm check knows it from the base class's declaration.
    with pytest.raises(ConfigError, match=re.escape("policy.type scaled trains with algo.type sac, drq or bc, not qc")):
        build_config({"policy": {"type": "scaled"}, "algo": {"type": "qc"}})


# A nested observation as the gym driver flattens it (gym-hil's Panda: pixels.front, pixels.wrist).
NESTED_SPACE = gym.spaces.Dict(
    {
        "agent_pos": gym.spaces.Box(-5.0, 5.0, (4,), np.float32),
        "pixels.front": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
        "pixels.wrist": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
    }
)


def nested_batch(rows: int, chunk: int) -> dict:
    """Every column the drq and bc updates read, for NESTED_SPACE and a 2-d action."""
    import torch

    def obs() -> dict:
        return {k: torch.as_tensor(np.stack([s.sample() for _ in range(rows)])) for k, s in NESTED_SPACE.spaces.items()}

    chunked = torch.rand(rows, chunk, 2) * 2 - 1
    return {
        "obs": obs(),
        "next_obs": obs(),
        "action": chunked[:, 0],
        "reward": torch.rand(rows),
        "terminated": torch.zeros(rows, dtype=torch.bool),
        "action_chunk": chunked,
        "intervened": torch.ones(rows),
        "policy_acted": torch.zeros(rows),
        "chunk_intervened": torch.ones(rows, chunk),
        "chunk_policy_acted": torch.zeros(rows, chunk),
    }


@pytest.mark.parametrize(("policy", "algo", "options"), [("mlp", "drq", {"hidden": [16]}), ("vla", "bc", {"chunk": 2})])
def test_policies_learn_from_cameras_whose_keys_hold_dots(
    tmp_path: Path, policy: str, algo: str, options: dict
) -> None:
    """torch forbids dots in module names: each camera's encoder is named `pixels:front` (its key
    stays `pixels.front` everywhere else), and the weights load back by name."""
    import torch

    from user_rl.policies.weights import load_weights, save_weights
    from user_rl.rewards.model import SuccessClassifier

    torch.manual_seed(0)
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    learner = make_algo(algo, NESTED_SPACE, action_space, policy, options)
    names = list(learner.actor.state_dict())
    assert any(".pixels:front." in n for n in names) and any(".pixels:wrist." in n for n in names), names
    batch = nested_batch(8, options.get("chunk", 1))
    act = learner.actor.act_chunk if policy == "vla" else learner.actor.act
    assert act(batch["obs"], deterministic=True).shape[0] == 8
    before = {n: t.clone() for n, t in learner.actor.state_dict().items() if ":front." in n}
    learner.update(batch)
    after = learner.actor.state_dict()
    assert any(not torch.equal(t, after[n]) for n, t in before.items()), "the front camera's encoder did not learn"
    save_weights(learner.actor, tmp_path / "actor.safetensors")
    assert load_weights(make_actor(policy, NESTED_SPACE, action_space, **options), tmp_path / "actor.safetensors") == []

    classifier = SuccessClassifier(NESTED_SPACE)
    frames = {k: v.numpy() for k, v in batch["obs"].items()}
    classifier.fit_normaliser(frames)
    assert classifier.probability(frames).shape == (8,)
