"""LeRobot's SmolVLA as our actor, offline, on a tiny SmolVLM written locally
(user_rl/policies/tiny_smolvlm.py): it acts exactly as LeRobot's own pipeline runs it, reads the
instruction, learns by behaviour cloning, and, frozen, is steered by DSRL through the noise its flow
integrates and corrected by residual RL. (Steered through the whole system, edge <-> learner:
test_lerobot_steering.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.lerobot.harness import run_in_lerobot

HERE = Path(__file__).parent
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # nothing may be downloaded


@pytest.fixture(scope="module")
def checks(lerobot_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("smolvla")
    done = run_in_lerobot(
        lerobot_python, str(HERE / "smolvla_checks.py"), str(work), env={**os.environ, **OFFLINE}, timeout=300
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_smolvla_saved_by_lerobot_acts_as_lerobots_own_pipeline_runs_it(checks: dict) -> None:
    assert checks["noise_shape"] == [8, 8]  # chunk_size rows, each padded to max_action_dim
    assert checks["pipeline_max_difference"] < 1e-4  # same noise, same chunk, in the robot's units
    assert checks["chunk_shape"] == [3, 4, 4]  # n_action_steps of the 8-action chunk, the arm's 4 actions
    assert checks["pretrained"]
    assert checks["state_shift_scale"] == pytest.approx([0.1, 2.0], rel=1e-5)  # save_smolvla.py's stats
    assert checks["image_scale"] == 1.0  # SmolVLA maps [0, 1] pixels to [-1, 1] itself
    assert checks["instruction_moves_the_chunk"]
    assert checks["task_is_the_fixed_one"]  # without an instruction observation: policy.task


def test_a_smolvla_saved_for_other_features_takes_the_robots(checks: dict) -> None:
    assert checks["other_robot_chunk_shape"] == [3, 4, 3]  # another camera, 5 state values, 3 actions
    assert checks["other_robot_action_scale"] == [2.0] * 3  # the robot's bounds, not the other robot's stats
    assert checks["other_robot_state_scale"] == [3.0] * 5


def test_mistakes_in_a_smolvla_config_are_named(checks: dict) -> None:
    assert checks["error_no_camera"].startswith("policy.lerobot: SmolVLA reads at least one camera image")
    assert checks["error_state_too_wide"] == (
        "policy.lerobot.max_state_dim: SmolVLA pads the state to 32 values; this robot's has 40"
    )


def test_a_smolvla_built_from_its_config_learns_by_behaviour_cloning(checks: dict) -> None:
    first, last = checks["bc_loss_first_last"]
    assert last < 0.7 * first, (first, last)  # 1.08 -> 0.30 when written
    assert checks["bc_same_on_the_edge"]


def test_a_frozen_smolvla_is_steered_by_dsrl_and_corrected_by_residual_rl(checks: dict) -> None:
    assert checks["dsrl_latent"] == 8 * 8  # the whole padded noise
    assert checks["dsrl_shared_latent"] == 8  # one padded row
    assert checks["residual_latent"] == 4 * 4  # a correction per executed action
    for name in ("dsrl", "dsrl_shared", "residual"):
        assert checks[f"{name}_chunk_shape"] == [2, 4, 4]
        assert checks[f"{name}_base_unchanged"] and checks[f"{name}_chunk_follows_the_small_actor"], name
    assert checks["noise_names_the_chunk"]
