"""The learner's cross-thread channels: the newest actor replaces one not yet published (whose
buffer goes back), a waiter hears its publication, and the launcher's pacing is read whole."""

from __future__ import annotations

import threading

from user_rl.cloud.handoffs import ActorHandOff, FleetPacing, Pace


class Actor:
    """Stands in for `PackedWeights`: only `release` is used by the hand-off."""

    def __init__(self) -> None:
        self.released = False

    def release(self) -> None:
        self.released = True


def test_a_newer_actor_replaces_one_not_yet_taken_and_frees_its_buffer() -> None:
    handoff = ActorHandOff()
    first, second = Actor(), Actor()
    handoff.offer(first)
    request = handoff.offer(second)
    assert first.released and not second.released
    assert handoff.take() == (request, second, 0)
    assert handoff.take() is None


def test_a_waiter_returns_once_its_request_is_published() -> None:
    handoff = ActorHandOff()
    request = handoff.offer(Actor())
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (handoff.wait_published(request, lambda: True), done.set()))
    waiter.start()
    assert not done.wait(0.2)
    taken, _, _ = handoff.take()
    handoff.published(taken)
    assert done.wait(10)
    waiter.join(10)


def test_pacing_changes_one_field_and_keeps_the_other() -> None:
    pacing = FleetPacing(Pace(4))
    pacing.set_hold(600)
    pacing.set_active_robots(3)
    assert pacing.get() == Pace(3, 600)
    pacing.set_hold(None)
    assert pacing.get() == Pace(3, None)
