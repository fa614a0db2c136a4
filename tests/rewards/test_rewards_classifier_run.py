"""A run rewarded by a success classifier trained on labelled sim frames learns the task, and the
env's reward never leaves the edge.

The user's path, end to end: record labelled frames (the scripted expert drives toward the target and
hands back 5 cm short, so random motion near the target gives the near misses a classifier most needs;
the sim labels each episode), `user-rl reward train` a classifier on them, `user-rl train` with
`reward.type: classifier` on the dense reach variant (its reward stays on the edge; only a judged
success ends an episode), then `user-rl eval` on the sparse variant, where success means touching
the target: the task.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.e2e.harness import ONLY_THE_FINAL_EVALUATION, evaluate, run_cli, train
from tests.rewards.recording import record_run
from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.config import build_config
from user_rl.hal.registry import make_robot
from user_rl.rewards.model import load_classifier
from user_rl.wire import user_rl_pb2 as pb

# Labelled frames: the expert takes over after 3 steps without progress and hands back 5 cm from
# the target; between take-overs the (never trained) policy acts at random. Touching ends a sparse
# episode (a success), the 30-step limit is a failure.
RECORD = [
    "algo.learning_starts=1000000000",
    "intervention.scripted=true",
    "intervention.patience=3",
    "intervention.handback_distance=0.05",
]
RECORD_STEPS = 60000  # ~15 s: labelled frames are cheap in sim, and the boundary needs many near misses
THRESHOLD = 0.9  # a policy finds the frames a classifier wrongly calls success: judge only the sure ones
FRESH_EPISODES = 100


@pytest.mark.long
@pytest.mark.timeout(1500)
def test_a_run_rewarded_by_the_success_classifier_learns_the_task(
    tmp_path: Path, seed_overrides: tuple[str, ...]
) -> None:
    record_run(
        tmp_path / "labelled",
        {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 30, "reward": "sparse"}},
        [*RECORD, *seed_overrides],
        RECORD_STEPS,
    )
    classifier_file = tmp_path / "classifier.pt"
    trained = run_cli(
        "reward",
        "train",
        str(tmp_path / "labelled"),
        "--keys",
        "state",
        "--hidden",
        "256",
        "256",
        "--updates",
        "10000",
        "--threshold",
        str(THRESHOLD),
        "--out",
        str(classifier_file),
        timeout=600,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    print(f"\nstate classifier: {trained.stdout.strip()}")

    # RLPD-style SAC with the scripted intervener, as in the interventions test, but the reward is
    # the classifier's: the dense variant's reward (minus the distance, never 0 or 1) stays on the edge.
    summary = train(
        "configs/reach_interventions.yaml",
        tmp_path / "run",
        *seed_overrides,
        "robot.options.reward=dense",
        "reward.type=classifier",
        f"reward.classifier={classifier_file}",
        f"reward.threshold={THRESHOLD}",
        *ONLY_THE_FINAL_EVALUATION,
        timeout=1200,
    )
    fresh = evaluate(summary["checkpoint"], FRESH_EPISODES, 11, "robot.options.reward=sparse")
    print(
        f"{summary['learner']['env_steps']:,} env steps rewarded by the classifier: success on {FRESH_EPISODES} "
        f"fresh episodes of the task (touch the target) {fresh['success_rate']:.2f}"
    )
    assert fresh["success_rate"] >= 0.8, fresh
    misspelt = run_cli("eval", summary["checkpoint"], "robot.options.rewrd=sparse", timeout=120)
    assert misspelt.returncode == 2 and "unknown option 'rewrd'" in misspelt.stderr, misspelt.stderr[-2000:]

    # What the learner stored: only the classifier's judgement.
    cfg = build_config({"robot": {"type": "mujoco_reach", "options": {"obs_mode": "state"}}})
    with make_robot("mujoco_reach", obs_mode="state") as robot:
        buffer = PersistentReplay(
            Path(summary["run_dir"]) / "buffer", robot.observation_space, robot.action_space, cfg.buffer
        )
    try:
        batch = buffer.sample(4096, np.random.default_rng(0))
    finally:
        buffer.close()
    rewards = batch["reward"]
    # 0 or 1, never the env's dense reward ...
    assert set(np.unique(rewards).tolist()) == {0.0, 1.0}
    # ... exactly the classifier's judgement of the step's outcome (the next observation); a judged
    # success ended its episode, labelled by the classifier.
    judged = load_classifier(classifier_file).probability({"state": batch["next_obs/state"]}) >= THRESHOLD
    np.testing.assert_array_equal(rewards == 1.0, judged)
    assert batch["terminated"][judged].all()
    assert (batch["label"][judged] == pb.LABEL_SUCCESS).all()
    assert (batch["label_by"][batch["label"] != pb.LABEL_NONE] == pb.LABEL_BY_CLASSIFIER).all()
    # The state ends with target - fingertip: how many judged successes were real (< 2 cm).
    distance = np.linalg.norm(batch["next_obs/state"][judged, -3:], axis=1)
    print(
        f"judged successes in a sample of 4096: {int(judged.sum())}, of which within the env's 2 cm: "
        f"{(distance < 0.02).mean():.2f} (median {np.median(distance):.3f} m)"
    )
