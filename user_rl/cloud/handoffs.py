"""What crosses between the learner's threads: one small thread-safe channel per thing that crosses.

The learner runs several threads (cloud/learner.py): the one that calls `run` (it reads the
trainer's replies), the ingest thread (it owns the sockets), the sampler, the TensorBoard thread,
and whoever placed the learner (a Ray actor's thread, the standalone loop) calling its control
methods. Nothing is handed over by writing another thread's attributes; each hand-off has its
own channel here, named after what crosses it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from user_rl.wire.weights import PackedWeights

T = TypeVar("T")


class Latest(Generic[T]):
    """The newest value of something one thread makes and others read (the status, the opened buffer)."""

    def __init__(self, value: T) -> None:
        self._lock = threading.Lock()
        self._value = value

    def set(self, value: T) -> None:
        with self._lock:
            self._value = value

    def get(self) -> T:
        with self._lock:
            return self._value


@dataclass(frozen=True)
class Pace:
    """How far a paced fleet and the updates may go: set by whoever placed the learner."""

    active_robots: int  # robots still running (fewer once one has failed: its share of credit moves on)
    hold_at: int | None = None  # the next evaluation point: the fleet and the updates stop there (None: no hold)


class FleetPacing(Latest[Pace]):
    """The launcher's word on the fleet (its thread sets it; the ingest and sampler threads read it)."""

    def set_active_robots(self, count: int) -> None:
        with self._lock:
            self._value = Pace(count, self._value.hold_at)

    def set_hold(self, env_steps: int | None) -> None:
        with self._lock:
            self._value = Pace(self._value.active_robots, env_steps)


class ActorHandOff:
    """The newest actor to publish, from the thread that reads the trainer's replies to the ingest
    thread (which owns the weight server's socket). A newer actor replaces one not yet taken; the
    replaced one's shared buffer goes back to the trainer."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: tuple[int, PackedWeights, int] | None = None  # (request number, actor, its updates)
        self._offered = self._published = 0

    def offer(self, actor: PackedWeights, updates: int = 0) -> int:
        """Hand over `actor` (after `updates` updates); returns its request number (for `wait_published`)."""
        with self._cond:
            self._offered += 1
            replaced, self._pending = self._pending, (self._offered, actor, updates)
            if replaced is not None and replaced[1].release is not None:
                replaced[1].release()  # never published: its buffer is free for the trainer again
            return self._offered

    def wait_published(self, request: int, keep_waiting: Callable[[], bool]) -> None:
        """Wait until request `request` (or a newer one) is published, while `keep_waiting()` holds."""
        with self._cond:
            while self._published < request and keep_waiting():
                self._cond.wait(0.1)

    def take(self) -> tuple[int, PackedWeights, int] | None:
        """The actor to publish now, its request number and updates, or None (ingest thread)."""
        with self._cond:
            pending, self._pending = self._pending, None
            return pending

    def published(self, request: int) -> None:
        """Request `request` is out (ingest thread)."""
        with self._cond:
            self._published = request
            self._cond.notify_all()
