"""Key -> robot latency as the robot measures it for everyone watching (user_rl/edge/teleop/latency.py):
a command that waited out an e-stop is left out, and a page that floods commands costs bounded memory."""

from __future__ import annotations

from user_rl.edge.teleop.latency import PENDING, WINDOW, KeyLatency


def test_latency_counts_commands_from_key_to_robot_and_leaves_out_those_held_by_an_estop() -> None:
    latency = KeyLatency()
    assert latency.summary() is None
    for i in range(10):  # pressed at 1000 + i s, on the robot 20 + i ms later
        latency.pressed("c1", i, (1000.0 + i) * 1000.0)
        assert latency.applied("c1", i, 1000.0 + i + (20 + i) / 1000.0, rearmed_at_s=None) == 20.0 + i
    # Pressed while the robot was stopped, applied after its re-arm: the wait was the e-stop's.
    latency.pressed("c1", 10, 2000.0 * 1000.0)
    assert latency.applied("c1", 10, 2005.0, rearmed_at_s=2004.0) is None
    # A re-arm before the press says nothing about it: counted.
    latency.pressed("c1", 11, 3000.0 * 1000.0)
    assert latency.applied("c1", 11, 3000.025, rearmed_at_s=2004.0) == 25.0
    # Not stamped (a refresh, or another client's id): nothing to count.
    assert latency.applied("c2", 11, 3000.0, rearmed_at_s=None) is None
    summary = latency.summary()
    assert summary["n"] == 11 and summary["left_out_estop"] == 1
    assert 24.0 <= summary["p50_ms"] <= 25.0 and 28.0 <= summary["p99_ms"] <= 29.0


def test_a_page_that_floods_commands_costs_bounded_memory() -> None:
    latency = KeyLatency()
    for i in range(10 * PENDING):
        latency.pressed("c1", i, 1000.0 * i)
    assert len(latency._pressed) == PENDING
    assert latency.applied("c1", 0, 1.0, None) is None  # the oldest were let go
    for i in range(10 * PENDING - WINDOW * 2, 10 * PENDING):
        latency.applied("c1", i, i + 0.01, None)
    assert latency.summary()["n"] == WINDOW
