"""A LeRobot policy as our actor, against LeRobot's own code: an ACT saved by LeRobot acts exactly as
LeRobot's pipeline runs it; a diffusion policy built from its config plans chunks and learns by
behaviour cloning; mistakes are named. (The run in which the edge runs ACT and takes the learner's
updates is in test_lerobot_devices.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from tests.lerobot.harness import run_in_lerobot
from user_rl.config import ConfigError, build_config
from user_rl.extras import LEROBOT_ENV_COMMAND

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def checks(lerobot_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    act_dir = tmp_path_factory.mktemp("policy") / "act"
    done = run_in_lerobot(lerobot_python, str(HERE / "policy_checks.py"), str(act_dir))
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "act_dir": str(act_dir)}


def test_an_act_saved_by_lerobot_acts_exactly_as_lerobots_own_pipeline_runs_it(checks: dict) -> None:
    assert checks["act_chunk_shape"] == [8, 10, 3]  # 8 states, ACT's 10-action chunks, 3 joints
    assert checks["act_max_difference"] < 1e-4  # its normaliser's stats and modes, as buffers of ours
    assert checks["pretrained"]  # so an edge acts with these weights before the learner's first version


def test_a_diffusion_policy_built_from_its_config_plans_chunks_and_learns_by_behaviour_cloning(checks: dict) -> None:
    assert checks["diffusion_chunk_shape"] == [2, 4, 3]  # n_action_steps of its 8-action horizon
    first, last = checks["diffusion_loss_first_last"]
    assert last < 0.9 * first, (first, last)
    assert checks["diffusion_same_on_the_edge"]  # an edge that loads the published weights plans the same chunk


def test_a_frozen_diffusion_policy_is_steered_by_dsrl_and_corrected_by_residual_rl(checks: dict) -> None:
    assert checks["dsrl_latent"] == 8 * 3 and checks["dsrl_shared_latent"] == 3  # the horizon's noise, or one row
    for name in ("dsrl", "dsrl_shared", "residual"):
        assert checks[f"{name}_chunk_shape"] == [2, 4, 3]  # the executed n_action_steps, 3 joints
        assert checks[f"{name}_base_unchanged"] and checks[f"{name}_chunk_follows_the_small_actor"], name
    assert checks["noise_names_the_chunk"]
    assert "noise_scheduler_type DDIM (this one is diffusion with DDPM)" in checks["error_dsrl_ddpm"]


def test_mistakes_in_a_lerobot_policy_are_named(checks: dict) -> None:
    assert checks["error_chunk"].startswith("policy.chunk: the act policy at ")
    assert checks["error_chunk"].endswith("plans 10 actions a chunk; set policy.chunk: 10")
    assert "this robot gives {'observation.state': ('STATE', (4,))" in checks["error_features"]
    assert checks["error_kind"].startswith("policy.lerobot.type: 'pi0' is not supported; one of act, diffusion")
    assert "dim_modle" in checks["error_field"] and checks["error_field"].startswith("policy.lerobot (act)")
    assert checks["error_history"].startswith("policy.lerobot.n_obs_steps: the edge gives the policy one observation")


def test_a_lerobot_policy_config_is_checked_and_without_lerobot_says_how_to_get_it() -> None:
    cfg = build_config(
        {"policy": {"type": "lerobot", "chunk": 10, "lerobot": {"path": "models/act"}}, "algo": {"type": "bc"}}
    )
    assert cfg.action_horizon == 10  # each row is sampled with the chunk it imitates
    assert Path(cfg.policy.options()["lerobot"]["path"]).is_absolute()  # the learner may run elsewhere
    for policy, algo, message in [
        (
            {"type": "lerobot", "lerobot": {"type": "act"}},
            "sac",
            "policy.type lerobot trains with algo.type bc, dsrl or residual",
        ),
        ({"type": "lerobot"}, "bc", "policy.lerobot: give its type (act, diffusion or smolvla"),
        ({"type": "lerobot", "lerobot": {"type": "act", "path": "x"}}, "bc", "policy.lerobot: give its type"),
        (
            {"type": "lerobot", "hidden": [64], "lerobot": {"type": "act"}},
            "bc",
            "policy.hidden is a setting of policy.type mlp, flow or vla",
        ),
    ]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            build_config({"policy": policy, "algo": {"type": algo}})
    from user_rl.policies import make_actor  # this environment has no lerobot

    spaces = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (3,), np.float32)}), gym.spaces.Box(-1, 1, (3,))
    with pytest.raises(RuntimeError, match="policy.type lerobot needs LeRobot") as missing:
        make_actor("lerobot", *spaces, **cfg.policy.options())
    assert LEROBOT_ENV_COMMAND in str(missing.value)  # the command that makes LeRobot's environment
