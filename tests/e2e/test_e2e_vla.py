"""End to end: the tiny VLA learns to touch the target its instruction names (`configs/reach_vla.yaml`).

Two targets, red and green, lie on the table; the state holds only the arm, so where they are comes
from the 32x32 top-camera image, and which one to touch from the instruction. Through the whole
system: 4 rendering sims, the scripted expert demonstrating through the edges and then correcting
the policy (HG-DAgger), the learner training the VLA's action chunks, weights back to the edges.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.harness import ONLY_THE_FINAL_EVALUATION, evaluate, train

# Per instruction, rendered (the costly part of judging). The expert itself touches ~0.94 of targets
# within 30 steps; nine training runs measured 0.92-0.98 on each instruction (docs/policies.md): at
# 0.92 the 0.8 bar fails on 30 episodes 1 time in 120 per instruction (binomial), at 0.90 1 in 40.
FRESH_EPISODES = 30
ENV_STEPS = 10000  # the config's: at 8,000 (about 6,400 updates) seed 3 scored 0.33 / 0.23 once


@pytest.mark.long
@pytest.mark.timeout(1500)
def test_the_tiny_vla_touches_the_target_its_instruction_names(tmp_path: Path, seed_overrides: tuple[str, ...]) -> None:
    summary = train(
        "configs/reach_vla.yaml",
        tmp_path,
        *seed_overrides,
        f"stop.max_env_steps={ENV_STEPS}",
        *ONLY_THE_FINAL_EVALUATION,
        timeout=1200,
        learning=True,
    )
    assert summary["stop_reason"] == "max_env_steps", summary["stdout"][-3000:]
    # The same fresh scenes told each instruction (a fixed goal leaves the scene's draws unchanged):
    # only the words differ, so touching the named target on both is the instruction steering it.
    told = {
        goal: evaluate(summary["checkpoint"], FRESH_EPISODES, 11, f"robot.options.goal={goal}")
        for goal in ("red", "green")
    }
    print(
        f"\ntiny VLA after {summary['learner']['env_steps']:,} env steps: success on {FRESH_EPISODES} fresh "
        f"episodes told red {told['red']['success_rate']:.2f}, told green {told['green']['success_rate']:.2f}"
    )
    for goal, result in told.items():
        assert result["success_rate"] >= 0.8, (goal, result)
