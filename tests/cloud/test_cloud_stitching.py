"""EpisodeStitcher: next observations follow the episode, across batches, never across episodes."""

from __future__ import annotations

import numpy as np

from user_rl.cloud.stitching import EpisodeStitcher
from user_rl.wire.transitions import FINAL_OBS, FINAL_ROW, OBS

KEYS = ["pos", "img"]


def obs_of(tag: float) -> dict[str, np.ndarray]:
    """An observation that encodes its own identity so pairings can be checked."""
    return {"pos": np.array([tag, -tag], np.float32), "img": np.full((2, 2, 3), int(tag * 2) % 256, np.uint8)}


def batch(rows: list[tuple]) -> dict[str, np.ndarray]:
    """rows: (episode, step, obs_tag, end) with end in {None, 'term', 'trunc'}; final obs tag = obs_tag + 0.5."""
    n = len(rows)
    cols: dict[str, np.ndarray] = {
        OBS + "pos": np.stack([obs_of(r[2])["pos"] for r in rows]),
        OBS + "img": np.stack([obs_of(r[2])["img"] for r in rows]),
        "action": np.array([[r[2]] for r in rows], np.float32),
        "reward": np.array([r[2] * 10 for r in rows], np.float32),
        "terminated": np.array([r[3] == "term" for r in rows]),
        "truncated": np.array([r[3] == "trunc" for r in rows]),
        "episode": np.array([r[0] for r in rows], np.uint64),
        "step": np.array([r[1] for r in rows], np.int64),
        "policy_version": np.zeros(n, np.int64),
        "actor": np.zeros(n, np.uint8),
        "label": np.zeros(n, np.uint8),
        "sensor_time": np.zeros(n, np.float64),
    }
    ended = [i for i, r in enumerate(rows) if r[3]]
    cols[FINAL_ROW] = np.array(ended, np.int64)
    if ended:
        cols[FINAL_OBS + "pos"] = np.stack([obs_of(rows[i][2] + 0.5)["pos"] for i in ended])
        cols[FINAL_OBS + "img"] = np.stack([obs_of(rows[i][2] + 0.5)["img"] for i in ended])
    return cols


def pairs(out: dict[str, np.ndarray]) -> dict[float, float]:
    """obs tag -> next obs tag for each stitched transition."""
    if not out:
        return {}
    return {float(a): float(b) for a, b in zip(out[OBS + "pos"][:, 0], out["next_" + OBS + "pos"][:, 0])}


def check_consistent(out: dict[str, np.ndarray]) -> None:
    """Every column has one row per transition, and images follow their state."""
    n = len(out["reward"])
    for key, value in out.items():
        assert len(value) == n, key
    np.testing.assert_array_equal(out["action"][:, 0], out[OBS + "pos"][:, 0])
    np.testing.assert_array_equal(out["reward"], out[OBS + "pos"][:, 0] * 10)
    assert not any(k.startswith(FINAL_OBS) or k == FINAL_ROW for k in out)
    assert out["next_" + OBS + "img"].dtype == np.uint8


def test_pairs_across_batch_boundaries() -> None:
    s = EpisodeStitcher(KEYS)
    out1 = s.stitch(batch([(0, 0, 1, None), (0, 1, 2, None), (0, 2, 3, None)]))
    assert pairs(out1) == {1: 2, 2: 3}  # the last row waits for its successor
    out2 = s.stitch(batch([(0, 3, 4, None), (0, 4, 5, None)]))
    check_consistent(out2)
    assert pairs(out2) == {3: 4, 4: 5}  # last of batch 1 -> first of batch 2
    out3 = s.stitch(batch([(0, 5, 6, None)]))  # a one-row batch
    assert pairs(out3) == {5: 6}
    out4 = s.stitch(batch([(0, 6, 7, "term")]))
    assert pairs(out4) == {6: 7, 7: 7.5}
    np.testing.assert_array_equal(out4["next_" + OBS + "img"][1], obs_of(7.5)["img"])
    assert s.dropped == 0


def test_ended_row_uses_final_obs_and_never_crosses_episodes() -> None:
    s = EpisodeStitcher(KEYS)
    out = s.stitch(batch([
        (0, 0, 1, None), (0, 1, 2, "trunc"),          # episode 0 ends by truncation
        (1, 0, 3, None), (1, 1, 4, "term"),           # episode 1 starts in the same batch, terminates
        (2, 0, 5, None),
    ]))
    check_consistent(out)
    assert pairs(out) == {1: 2, 2: 2.5, 3: 4, 4: 4.5}  # 2 -> its final obs, not episode 1's first obs
    flags = {float(t): (bool(te), bool(tr)) for t, te, tr in
             zip(out[OBS + "pos"][:, 0], out["terminated"], out["truncated"])}
    assert flags == {1: (False, False), 2: (False, True), 3: (False, False), 4: (True, False)}
    assert s.dropped == 0
    out = s.stitch(batch([(2, 1, 6, None)]))
    assert pairs(out) == {5: 6}


def test_episode_ending_on_the_last_row_does_not_pair_with_the_next_batch() -> None:
    s = EpisodeStitcher(KEYS)
    out = s.stitch(batch([(0, 0, 1, None), (0, 1, 2, "trunc")]))
    assert pairs(out) == {1: 2, 2: 2.5}
    out = s.stitch(batch([(1, 0, 3, None), (1, 1, 4, None)]))
    assert pairs(out) == {3: 4}  # nothing pairs 2 with 3
    assert s.dropped == 0


def test_gap_in_steps_drops_the_record() -> None:
    s = EpisodeStitcher(KEYS)
    out = s.stitch(batch([(0, 0, 1, None), (0, 1, 2, None), (0, 3, 3, None), (0, 4, 4, None)]))
    assert pairs(out) == {1: 2, 3: 4}  # 2 is not paired with 3 (step 2 is missing)
    assert s.dropped == 1
    # A gap across the batch boundary.
    out = s.stitch(batch([(0, 6, 5, None), (0, 7, 6, None)]))
    assert pairs(out) == {5: 6}
    assert s.dropped == 2


def test_episode_change_without_an_end_drops_the_record() -> None:
    s = EpisodeStitcher(KEYS)
    out = s.stitch(batch([(0, 0, 1, None), (0, 1, 2, None), (1, 2, 3, None), (1, 3, 4, None)]))
    assert pairs(out) == {1: 2, 3: 4}  # even though step 2 follows step 1
    assert s.dropped == 1
    out = s.stitch(batch([(2, 4, 5, None), (2, 5, 6, None)]))  # new episode across the boundary
    assert pairs(out) == {5: 6}
    assert s.dropped == 2


def test_reset_forgets_the_pending_record() -> None:
    s = EpisodeStitcher(KEYS)
    s.stitch(batch([(0, 0, 1, None), (0, 1, 2, None)]))
    s.reset()  # a new stream epoch
    assert s.dropped == 1
    out = s.stitch(batch([(0, 2, 3, None), (0, 3, 4, None)]))
    assert pairs(out) == {3: 4}


def test_terminated_only_for_real_terminations() -> None:
    s = EpisodeStitcher(KEYS)
    rows = []
    for ep in range(4):
        for step in range(3):
            end = ("term" if ep % 2 else "trunc") if step == 2 else None
            rows.append((ep, step, ep * 10 + step, end))
    out = s.stitch(batch(rows))
    check_consistent(out)
    assert len(out["reward"]) == 12
    tags = out[OBS + "pos"][:, 0]
    expected_term = np.array([t % 10 == 2 and (t // 10) % 2 == 1 for t in tags])
    expected_trunc = np.array([t % 10 == 2 and (t // 10) % 2 == 0 for t in tags])
    np.testing.assert_array_equal(out["terminated"], expected_term)
    np.testing.assert_array_equal(out["truncated"], expected_trunc)
