"""End to end: people in the loop, with the scripted intervener standing in for a person.

Sparse reach (reward 1 only on touching the target) is a task SAC alone does not solve in the
~20,000 env steps that the helped run needs (at most 30,000); with the scripted expert taking over
whenever the policy stops making progress (its steps sampled half and half with online data, RLPD
style) it does, and the intervention rate falls as the policy improves. HG-DAgger (a policy trained
from the scripted interventions alone) is shown reaching its goal by the tiny VLA in
`test_e2e_vla.py` and, offline, by `tests/algos/test_algos_bc.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.harness import ONLY_THE_FINAL_EVALUATION, evaluate, train

FRESH_EPISODES = 100  # a policy at 85% fails the 80% bar on 100 episodes about 1 run in 10 ... at 90%: 1 in 1000


def intervention_rates(run_dir: Path) -> list[float]:
    """The fleet's intervention rate in each progress record once the policy acts (after warm-up)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["intervention_rate"] for r in records if "eval" not in r and r.get("policy_version", 0) > 0]


@pytest.mark.long
@pytest.mark.timeout(1200)
def test_interventions_solve_a_sparse_task_that_sac_alone_does_not(
    tmp_path: Path, seed_overrides: tuple[str, ...]
) -> None:
    # Helped: until two evaluations in a row (100 episodes each) reach 0.9, at most 30,000 env steps.
    helped = train(
        "configs/reach_interventions.yaml",
        tmp_path / "helped",
        *seed_overrides,
        "stop.success_rate=0.9",
        "stop.confirm_evals=2",
        "stop.eval_every_s=15",
    )
    steps = helped["learner"]["env_steps"]
    assert helped["stop_reason"] == "goal_reached" and steps <= 30000, helped["stdout"][-3000:]
    # Alone: as many env steps as the helped run needed.
    alone = train(
        "configs/reach_interventions.yaml",
        tmp_path / "alone",
        *seed_overrides,
        "intervention.scripted=false",
        "buffer.mix=null",
        f"stop.max_env_steps={steps}",
        *ONLY_THE_FINAL_EVALUATION,
    )
    assert alone["learner"]["env_steps"] <= steps
    helped_fresh = evaluate(helped["checkpoint"], episodes=FRESH_EPISODES, seed=11)
    alone_fresh = evaluate(alone["checkpoint"], episodes=FRESH_EPISODES, seed=11)
    print(
        f"\nsparse reach, {steps:,} env steps, success on {FRESH_EPISODES} fresh episodes: "
        f"with interventions {helped_fresh['success_rate']:.2f}, SAC alone {alone_fresh['success_rate']:.2f}"
    )
    assert helped_fresh["success_rate"] >= 0.8, helped_fresh
    assert alone_fresh["success_rate"] < 0.3, alone_fresh

    # The expert took over often at first and less as the policy learned.
    rates = intervention_rates(Path(helped["run_dir"]))
    tenth = max(1, len(rates) // 10)
    early, late = sum(rates[:tenth]) / tenth, sum(rates[-tenth:]) / tenth
    print(f"intervention rate: {early:.2f} in the first tenth of the run, {late:.2f} in the last")
    assert late < 0.75 * early, rates
    assert all(robot["take_overs"] > 0 for robot in helped["learner"]["robots"].values())
    assert not any(robot["take_overs"] for robot in alone["learner"]["robots"].values())
