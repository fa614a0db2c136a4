"""What record and replay need to drive a robot at its rate: every call to the robot on one thread
of its own, with a deadline, a clock that sleeps to the next period, and a clean stop (Ctrl-C,
then the robot's hold).

A robot is used from the thread that made it (camera and GL contexts are bound to it), so the
robot is built on that thread too. A call that does not return within `fleet.stall_s` (a bus that
stopped answering) raises `RobotStalled` in the caller, which then ends the command cleanly
instead of hanging with it; the stuck call is left behind on its daemon thread, and the robot
takes no further call (not even `hold` or `close`: the driver never gets one during another).
"""

from __future__ import annotations

import math
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

from user_rl.hal.robot import Observation, Robot, StepResult
from user_rl.robots.safety import ActionFilter

T = TypeVar("T")


class RobotStalled(RuntimeError):
    """A call to the robot did not return within its deadline."""


class RobotThread:
    """Runs calls to one robot, one at a time, on a daemon thread; each waited for `stall_s` at most."""

    def __init__(self, stall_s: float, name: str = "robot") -> None:
        self.stall_s = stall_s
        self.name = name
        self.stalled: str | None = None  # why the robot takes no more calls
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple, dict, Future] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"robot-{name}", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on the robot's thread, waited for `stall_s`; its exception is raised here."""
        return self._wait(fn, args, kwargs, self.stall_s)

    def build(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Build the robot on its thread, without a deadline: connecting may calibrate, which asks a person."""
        return self._wait(fn, args, kwargs, None)

    def _wait(self, fn: Callable[..., T], args: tuple, kwargs: dict, deadline_s: float | None) -> T:
        if self.stalled is not None:
            raise RobotStalled(self.stalled)
        done: Future = Future()
        self._jobs.put((fn, args, kwargs, done))
        try:
            return done.result(deadline_s)
        except FutureTimeout:
            what = getattr(fn, "__name__", "?")
            self.stalled = (
                f"{self.name}: a call to the robot ({what}) did not return within {deadline_s:g} s (fleet.stall_s): "
                "the robot stopped answering; it takes no further call (not even hold): check its power and cable"
            )
            raise RobotStalled(self.stalled) from None

    def close(self) -> None:
        """Let the thread end once the calls queued before are done (at once if none is stuck)."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, kwargs, done = job
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # the caller decides; this thread goes on
                done.set_exception(exc)


class Ticker:
    """Keeps a loop at `hz`: `wait()` sleeps to the next tick. A late step skips the ticks it missed
    (counted in `late`) rather than step in a burst to catch up; `restart()` after a pause (a reset)."""

    def __init__(self, hz: float) -> None:
        self.period = 1.0 / hz
        self.late = 0
        self._next = time.monotonic()

    def restart(self) -> None:
        self._next = time.monotonic()

    def wait(self) -> None:
        self._next += self.period
        behind = time.monotonic() - self._next
        if behind > 0:
            self.late += 1
            self._next += self.period * math.ceil(behind / self.period)
        time.sleep(max(0.0, self._next - time.monotonic()))


def say_on_stderr(text: str) -> None:
    """Progress and notes go to stderr (stdout stays for what a script reads)."""
    print(text, file=sys.stderr, flush=True)


def filtered_step(robot: Robot, safety: ActionFilter, action: np.ndarray, obs: Observation) -> StepResult:
    """One action through the safety filter to the robot; run on the robot's thread (`RobotThread.call`)."""
    return robot.step(safety(np.asarray(action, robot.action_space.dtype), obs))


def ended(result: StepResult, robot: Robot) -> bool:
    """Whether a step ended the robot's episode: a sim's end, or a real robot's terminated. A real
    robot's truncated is a training time limit (a LeRobot arm's `episode_steps`): record and replay
    have their own length, and a real arm can always take the next step."""
    return result.terminated or (result.truncated and robot.device_kind == "sim")


def let_go(calls: RobotThread, robot: Robot, say: Callable[[str], None]) -> None:
    """The robot holds where it is, then closes; one that stopped answering takes no call (it is said)."""
    for call in (robot.hold, robot.close):
        try:
            calls.call(call)
        except RobotStalled as exc:
            say(f"{robot.descriptor.id}: not held: {exc}")
            break
        except Exception as exc:  # a driver's hold or close may raise anything; the command ends anyway
            say(f"{robot.descriptor.id}: {call.__name__} failed: {type(exc).__name__}: {exc}")
    calls.close()


@contextmanager
def stopped_by_signals(stop: Callable[[], None], message: str, say: Callable[[str], None]) -> Iterator[None]:
    """Ctrl-C and SIGTERM call `stop` (the loop ends at its next step, cleanly); a second Ctrl-C stops at once."""
    asked: list[int] = []

    def handle(signum: int, frame: object) -> None:
        if asked:
            raise KeyboardInterrupt
        asked.append(signum)
        say(message)
        stop()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
