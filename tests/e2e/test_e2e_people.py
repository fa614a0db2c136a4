"""End to end: people in the loop, with the scripted intervener standing in for a person.

Sparse reach (touch the target) is a task SAC alone does not solve in 30,000 env steps; with people
taking over whenever the policy stops making progress (their steps sampled half and half with online
data, RLPD style) and a reward learned from the frames they labelled, it does, and the take-overs
become rare as the policy improves. One run shows both, as a user would run it:

1. record labelled frames (the scripted expert drives toward the target and hands back 5 cm short,
   so random motion near the target gives the near misses a classifier most needs; the sim labels
   each episode), and `user-rl reward train` a success classifier on them;
2. `user-rl train` with the intervener and `reward.type: classifier` on the dense reach variant: the
   env's reward never leaves the edge, only a judged success ends an episode;
3. `user-rl eval` on the sparse variant, where success means touching the target: the task.

SAC alone gets the env's own sparse reward (exact, where the helped run's is learned) and the same
30,000 env steps, in a test of its own. HG-DAgger (a policy
trained from the interventions alone) is shown by the tiny VLA in `test_e2e_vla.py` and, offline,
by `tests/algos/test_algos_bc.py`.
"""

from __future__ import annotations

import json
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
ENV_STEPS = 30000  # both runs' budget (configs/reach_interventions.yaml's)
# Measured: the helped run 0.96-1.00 on 100 fresh episodes, SAC alone 0.00-0.07 (docs/people.md). A
# policy at 0.90 fails the 0.8 bar on 100 episodes 1 run in 1,000; one at 0.15 passes 0.3 all but 1 in 300.
FRESH_EPISODES = 100


def intervention_rates(run_dir: Path) -> list[float]:
    """The fleet's intervention rate in each progress record once the policy acts (after warm-up)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["intervention_rate"] for r in records if "eval" not in r and r.get("policy_version", 0) > 0]


@pytest.mark.long
@pytest.mark.timeout(1500)
def test_people_taking_over_and_a_reward_learned_from_their_labels_solve_sparse_reach(
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

    # RLPD-style SAC with the scripted intervener; the reward is the classifier's: the dense variant's
    # reward (minus the distance, never 0 or 1) stays on the edge.
    summary = train(
        "configs/reach_interventions.yaml",
        tmp_path / "run",
        *seed_overrides,
        "robot.options.reward=dense",
        "reward.type=classifier",
        f"reward.classifier={classifier_file}",
        f"reward.threshold={THRESHOLD}",
        f"stop.max_env_steps={ENV_STEPS}",
        *ONLY_THE_FINAL_EVALUATION,
        timeout=1200,
        learning=True,
    )
    assert summary["stop_reason"] == "max_env_steps", summary["stdout"][-3000:]
    fresh = evaluate(summary["checkpoint"], FRESH_EPISODES, 11, "robot.options.reward=sparse")
    print(
        f"{summary['learner']['env_steps']:,} env steps with take-overs, rewarded by the classifier: success on "
        f"{FRESH_EPISODES} fresh episodes of the task (touch the target) {fresh['success_rate']:.2f}"
    )
    assert fresh["success_rate"] >= 0.8, fresh
    misspelt = run_cli("eval", summary["checkpoint"], "robot.options.rewrd=sparse", timeout=120)
    assert misspelt.returncode == 2 and "unknown option 'rewrd'" in misspelt.stderr, misspelt.stderr[-2000:]

    # People took over often at first and rarely once the policy had learned.
    rates = intervention_rates(Path(summary["run_dir"]))
    tenth = max(1, len(rates) // 10)
    early, late = sum(rates[:tenth]) / tenth, sum(rates[-tenth:]) / tenth
    print(f"intervention rate: {early:.2f} in the first tenth of the run, {late:.2f} in the last")
    assert late < 0.75 * early, rates
    assert all(robot["take_overs"] > 0 for robot in summary["learner"]["robots"].values())

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


@pytest.mark.long
@pytest.mark.timeout(1100)
def test_sac_alone_does_not_solve_sparse_reach_in_the_same_env_steps(
    tmp_path: Path, seed_overrides: tuple[str, ...]
) -> None:
    alone = train(
        "configs/reach_interventions.yaml",
        tmp_path,
        *seed_overrides,
        "intervention.scripted=false",
        "buffer.mix=null",
        f"stop.max_env_steps={ENV_STEPS}",
        *ONLY_THE_FINAL_EVALUATION,
        timeout=1000,
        learning=True,
    )
    assert alone["stop_reason"] == "max_env_steps" and alone["learner"]["env_steps"] <= ENV_STEPS
    fresh = evaluate(alone["checkpoint"], episodes=FRESH_EPISODES, seed=11)
    print(f"\nSAC alone after {alone['learner']['env_steps']:,} env steps: success {fresh['success_rate']:.2f}")
    assert fresh["success_rate"] < 0.3, fresh
    assert not any(robot["take_overs"] for robot in alone["learner"]["robots"].values())
