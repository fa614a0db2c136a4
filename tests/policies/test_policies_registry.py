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
