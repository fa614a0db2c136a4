"""Sampler: uniform, recency and task-balanced draws, per-source mixes, settings checks, caching.

The statistical checks are seeded; their tolerances sit several standard deviations out, so a
correct sampler passes with any seed while a wrong distribution fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from user_rl.cloud.buffer.sampling import SOURCES, Sampler, SamplerSettings, split

ONLINE, DEMO, INTERVENTION = (SOURCES.index(s) for s in SOURCES)


def catalog(n: int, source: np.ndarray | int = ONLINE, task: np.ndarray | int = 0, order: np.ndarray | None = None):
    """Parallel catalog arrays as the buffer keeps them."""
    return (
        np.arange(n, dtype=np.int64) if order is None else order.astype(np.int64),
        np.broadcast_to(np.asarray(source, np.uint8), (n,)).copy(),
        np.broadcast_to(np.asarray(task, np.int32), (n,)).copy(),
    )


def draw(sampler: Sampler, cat, batch_size: int, seed: int = 0, version: int = 1) -> np.ndarray:
    return sampler.draw(*cat, batch_size=batch_size, rng=np.random.default_rng(seed), version=version)


def test_uniform_covers_every_index_evenly():
    n, draws = 1000, 200_000
    rows = draw(Sampler(SamplerSettings()), catalog(n), draws)
    assert rows.dtype == np.int64 and rows.shape == (draws,)
    assert rows.min() >= 0 and rows.max() < n
    counts = np.bincount(rows, minlength=n)
    expected = draws / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # chi-square with 999 dof: mean 999, sd ~45; a skewed sampler lands far outside
    assert 999 - 6 * 45 < chi2 < 999 + 6 * 45, chi2


def test_recency_newest_quarter_twice_the_one_before():
    n, draws = 40_000, 400_000
    sampler = Sampler(SamplerSettings(strategy="recency", recency_half_life=n // 4))
    quarter = draw(sampler, catalog(n), draws) // (n // 4)
    q = np.bincount(quarter, minlength=4)
    assert q[3] / q[2] == pytest.approx(2.0, abs=0.05)
    assert q[2] / q[1] == pytest.approx(2.0, abs=0.08)
    assert q[3] / draws == pytest.approx(8 / 15, abs=0.005)  # 1/2 + 1/4 + 1/8 + 1/16 = 15/16


def test_recency_matches_formula_on_order_with_gaps():
    rng = np.random.default_rng(7)
    n, draws, half_life = 20_000, 300_000, 3_000
    order = np.cumsum(rng.integers(1, 6, size=n))  # insertion order with gaps; weights follow order, not rank
    sampler = Sampler(SamplerSettings(strategy="recency", recency_half_life=half_life))
    rows = draw(sampler, catalog(n, order=order), draws)
    weight = 0.5 ** ((order.max() - order) / half_life)
    expected_cdf = np.cumsum(weight) / weight.sum()
    empirical_cdf = np.cumsum(np.bincount(rows, minlength=n)) / draws
    ks = np.abs(expected_cdf - empirical_cdf).max()
    assert ks < 0.004, ks  # Kolmogorov bound at 1% for 300k draws is ~0.003
    # rank-based weights would put visibly different mass on the oldest half
    assert empirical_cdf[n // 2] == pytest.approx(expected_cdf[n // 2], abs=0.004)


def test_task_balanced_gives_each_task_an_equal_share():
    rng = np.random.default_rng(3)
    task = rng.permutation(np.r_[np.zeros(9000, np.int32), np.full(1000, 5, np.int32)])
    cat = catalog(10_000, task=task)
    rows = draw(Sampler(SamplerSettings(strategy="task_balanced")), cat, 100_000)
    share_small = float((task[rows] == 5).mean())
    assert share_small == pytest.approx(0.5, abs=0.01)
    # within a task, draws are uniform: the small task's 1000 entries each get ~50
    small_counts = np.bincount(rows[task[rows] == 5], minlength=10_000)[task == 5]
    assert small_counts.min() > 15 and small_counts.max() < 100


def test_mix_5050_with_rare_demo_puts_exactly_half_demo_in_every_batch():
    n = 10_000
    source = np.full(n, ONLINE, np.uint8)
    source[::100] = DEMO  # demo is 1% of the data
    source[1::100] = INTERVENTION  # present, but not named in the mix: never drawn
    cat = catalog(n, source=source)
    sampler = Sampler(SamplerSettings(mix={"online": 0.5, "demo": 0.5}))
    rng = np.random.default_rng(0)
    for _ in range(50):
        rows = sampler.draw(*cat, batch_size=256, rng=rng, version=1)
        assert int((source[rows] == DEMO).sum()) == 128
        assert int((source[rows] == ONLINE).sum()) == 128
    assert (source[rows[:128]] == ONLINE).all()  # grouped by source, in SOURCES order


def test_mixed_source_without_data_gives_its_share_to_the_others():
    source = np.r_[np.full(900, ONLINE), np.full(100, DEMO)].astype(np.uint8)
    sampler = Sampler(SamplerSettings(mix={"online": 0.5, "demo": 0.25, "intervention": 0.25}))
    rows = draw(sampler, catalog(1000, source=source), 256)
    # renormalised 2/3, 1/3 of 256 = 170.67, 85.33 -> largest remainder gives online the extra row
    assert np.bincount(source[rows], minlength=3).tolist() == [171, 85, 0]


def test_split_is_largest_remainder():
    assert split(np.full(3, 1 / 3), 256).tolist() == [86, 85, 85]
    assert split(np.array([0.1, 0.6, 0.3]), 7).tolist() == [1, 4, 2]  # 0.7, 4.2, 2.1
    assert split(np.array([1.0]), 5).tolist() == [5]


@pytest.mark.parametrize("mix", [None, {"demo": 1.0}])
def test_empty_catalog_or_empty_mixed_sources_raise(mix):
    sampler = Sampler(SamplerSettings(mix=mix))
    with pytest.raises(ValueError, match="cannot sample from an empty replay buffer"):
        draw(sampler, catalog(0), 8)
    if mix is not None:  # online data only, but the mix asks for demo
        with pytest.raises(ValueError, match="cannot sample from an empty replay buffer"):
            draw(sampler, catalog(10, source=ONLINE), 8, version=2)


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (dict(strategy="newest"), "unknown strategy 'newest'; allowed: uniform, recency, task_balanced"),
        (dict(recency_half_life=0), "recency_half_life must be a number >= 1"),
        (dict(mix={"offline": 1.0}), "allowed: online, demo, intervention"),
        (dict(mix={"online": -0.5, "demo": 1.0}), "finite numbers >= 0"),
        (dict(mix={"online": 0.0}), "sum to more than 0"),
        (dict(mix={}), "sum to more than 0"),
    ],
)
def test_bad_settings_name_the_problem(settings, problem):
    with pytest.raises(ValueError, match=problem):
        SamplerSettings(**settings).validate()
    with pytest.raises(ValueError, match=problem):
        Sampler(SamplerSettings(**settings))


def test_all_problems_reported_together():
    with pytest.raises(ValueError) as info:
        SamplerSettings(strategy="x", recency_half_life=0, mix={"bogus": 1.0}).validate()
    message = str(info.value)
    assert "strategy" in message and "recency_half_life" in message and "bogus" in message


def test_bad_draw_arguments():
    sampler = Sampler(SamplerSettings())
    order, source, task = catalog(10)
    with pytest.raises(ValueError, match="batch_size"):
        sampler.draw(order, source, task, 0, np.random.default_rng(0), 1)
    with pytest.raises(ValueError, match="differ in length"):
        sampler.draw(order, source[:5], task, 4, np.random.default_rng(0), 1)


@pytest.mark.parametrize("strategy", ["uniform", "recency"])
def test_tables_are_built_once_per_version_even_at_a_million(strategy, monkeypatch):
    n = 1_000_000
    source = np.full(n, ONLINE, np.uint8)
    source[::50] = DEMO
    cat = catalog(n, source=source)
    sampler = Sampler(SamplerSettings(strategy=strategy, mix={"online": 0.5, "demo": 0.5}))
    builds = []
    real_build = sampler._build
    monkeypatch.setattr(sampler, "_build", lambda *a: builds.append(1) or real_build(*a))
    rng = np.random.default_rng(0)
    sampler.draw(*cat, 256, rng, version=1)
    plan = sampler.plan
    for _ in range(200):
        sampler.draw(*cat, 256, rng, version=1)
    assert len(builds) == 1
    assert sampler.plan is plan and all(a is b for a, b in zip(sampler.plan.groups, plan.groups))
    sampler.draw(*cat, 256, rng, version=2)
    assert len(builds) == 2 and sampler.plan is not plan


@pytest.mark.parametrize("strategy", ["uniform", "recency", "task_balanced"])
def test_grown_catalog_is_sampled_after_version_bump(strategy):
    sampler = Sampler(SamplerSettings(strategy=strategy, recency_half_life=50))
    rng = np.random.default_rng(1)
    old = catalog(100)
    assert sampler.draw(*old, 2000, rng, version=1).max() < 100
    grown = catalog(200, task=np.r_[np.zeros(100), np.ones(100)])
    rows = sampler.draw(*grown, 2000, rng, version=2)
    assert (rows >= 100).mean() > 0.4  # half the entries (uniform), newest (recency), new task


@pytest.mark.parametrize("strategy", ["uniform", "recency", "task_balanced"])
@pytest.mark.parametrize("mix", [None, {"online": 0.5, "demo": 0.25, "intervention": 0.25}])
def test_a_growing_catalog_extends_the_tables_without_rebuilding(strategy, mix, monkeypatch):
    """The buffer appends a few entries between draws: the tables grow in O(new entries) and end
    up exactly as a fresh build over the whole catalog (same entries, same recency weights)."""
    rng = np.random.default_rng(3)
    n = 20_000
    order = np.cumsum(rng.integers(1, 3, n))  # increasing, with gaps
    source = rng.choice([ONLINE, DEMO, INTERVENTION], n, p=[0.8, 0.1, 0.1]).astype(np.uint8)
    task = rng.integers(0, 3, n).astype(np.int32)
    grown = Sampler(
        SamplerSettings(strategy=strategy, recency_half_life=20, mix=mix)
    )  # recency re-bases its weights twice
    builds = []
    real_build = grown._build
    monkeypatch.setattr(grown, "_build", lambda *a: builds.append(1) or real_build(*a))
    for end in range(32, n + 1, 32):  # 625 appends of 32, one draw after each
        rows = grown.draw(order[:end], source[:end], task[:end], 64, rng, version=7)
        assert rows.max() < end
    assert len(builds) == 1, "appends must not rebuild the sampler's tables"
    fresh = Sampler(SamplerSettings(strategy=strategy, recency_half_life=20, mix=mix))
    fresh.draw(order[:end], source[:end], task[:end], 64, rng, version=7)
    assert len(grown.plan.groups) == len(fresh.plan.groups)
    assert [len(g) for g in grown.plan.groups] == [len(f) for f in fresh.plan.groups]

    def entries(group) -> np.ndarray:
        return group.rows[0, : group.count[0]]

    for g, f in zip(grown.plan.groups, fresh.plan.groups):
        np.testing.assert_array_equal(entries(g), entries(f))
        if strategy == "recency":
            a, b = g.cumulative[0, : g.count[0]], f.cumulative[0, : f.count[0]]
            np.testing.assert_allclose(np.diff(a) / a[-1], np.diff(b) / b[-1], rtol=1e-9, atol=1e-15)
        if strategy == "task_balanced":
            assert {t: entries(x).tolist() for t, x in g.by_task.items()} == {
                t: entries(x).tolist() for t, x in f.by_task.items()
            }
