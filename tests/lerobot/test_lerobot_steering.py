"""A frozen LeRobot base steered through the whole system (edge <-> learner), in the LeRobot
environment: a tiny SmolVLA on reach's camera and instruction, and a diffusion policy with a DDIM
sampler on reach's state, each under dsrl and residual (steering_run.py; tests/edge/test_edge_steering.py
does the same for a flow base). The edge runs the steered actor; every version it receives carries
the base as the directory had it and a small actor that moves; the base's bytes travel once; the
executed chunk follows the small actor; the learner's base at the end is still the directory's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.lerobot.harness import run_in_lerobot

HERE = Path(__file__).parent
ACTORS = {"dsrl": "NoiseSteeredActor", "residual": "ResidualChunkActor"}


@pytest.mark.parametrize("base", ["smolvla", "diffusion"])
@pytest.mark.parametrize("algo", sorted(ACTORS))
def test_a_frozen_lerobot_base_is_steered_through_edge_and_learner(
    lerobot_python: Path, tmp_path: Path, base: str, algo: str
) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = run_in_lerobot(
        lerobot_python, str(HERE / "steering_run.py"), str(tmp_path), base, algo, env=env, timeout=480
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert not found["errors"], found["errors"]
    assert found["actor"] == ACTORS[algo]
    assert found["edge_base_is_the_files"] and found["edge_base_still_the_files"], (
        "the base the edge runs is not the file's"
    )
    assert found["learner_base_is_the_files"], "the learner's base moved"
    assert found["small_actor_trained"]
    assert found["chunk_follows_the_small_actor"]
    assert found["chunk_shape"][:2] == [1, 4]  # the executed n_action_steps
    # the base travelled once; every later version moved only the small actor (and the action scaling)
    frozen, trainable, steer = found["frozen_bytes"], found["trainable_bytes"], found["steer_bytes"]
    assert frozen == found["base_parameter_bytes"]
    assert steer <= trainable < steer + 4096, found
    received, completed = found["received_bytes"], found["completed"]
    assert frozen + completed * trainable <= received <= frozen + (completed + 1) * trainable, found
