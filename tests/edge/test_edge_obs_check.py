"""The edge's own check of what a robot returns: NaN / inf in a float observation or a reward is
named, and resets that keep returning one are paced (a real arm never resets without pause)."""

from __future__ import annotations

import numpy as np

from user_rl.edge.obs_check import MAX_RESET_WAIT_S, RESET_WAIT_S, ObservationCheck, unusable


def test_non_finite_floats_are_named_and_images_are_not_checked() -> None:
    good = {"state": np.zeros(3, np.float32), "image": np.zeros((2, 2, 3), np.uint8)}
    assert unusable(good, 0.5) is None
    assert unusable({**good, "state": np.array([0.0, np.inf, 0.0], np.float32)}) == "obs/state holds NaN or inf"
    assert unusable(good, float("nan")) == "the reward is NaN or inf"


def test_resets_that_keep_returning_a_bad_observation_wait_longer_each_time() -> None:
    check = ObservationCheck("arm-0")
    bad, good = {"state": np.full(3, np.nan, np.float32)}, {"state": np.zeros(3, np.float32)}
    waits = [check.reset(bad, episode=4) for _ in range(8)]
    assert waits[:3] == [RESET_WAIT_S, 2 * RESET_WAIT_S, 4 * RESET_WAIT_S] and waits[-1] == MAX_RESET_WAIT_S
    assert check.reset(good, episode=4) is None and check.reset(bad, episode=4) == RESET_WAIT_S  # in a row only
    assert check.step(bad, 0.0, episode=4, step=7) == "obs/state holds NaN or inf"
    assert check.bad == 10 and check.error == "obs/state holds NaN or inf (episode 4, step 7: episode ended)"
