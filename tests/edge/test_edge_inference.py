"""Asynchronous chunk inference (user_rl/edge/inference.py): the control loop keeps its period while
the next chunk is inferred, and switches to it at the step it was planned for."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from torch import nn

from user_rl.edge.inference import AsyncChunkRunner
from user_rl.policies.chunking import ChunkRunner

HORIZON = 8
PERIOD_S = 0.02  # 50 Hz


class SteppedClock:
    """The robot's step counter, which a slow policy can wait on."""

    def __init__(self) -> None:
        self.steps = 0
        self._changed = threading.Condition()

    def tick(self) -> None:
        with self._changed:
            self.steps += 1
            self._changed.notify_all()

    def wait_for(self, steps: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self.steps >= steps, timeout=10)

    def stop(self) -> None:
        """The loop is over: an inference still waiting for steps returns."""
        with self._changed:
            self.steps = 10**9
            self._changed.notify_all()


class SlowChunkPolicy(nn.Module):
    """A chunk policy whose action i of the chunk planned at step k is k * 100 + i, and whose inference
    takes `latency_steps` control steps (it returns once the robot has taken them; not the first,
    which the loop waits for) or `latency_s`."""

    chunk_length = HORIZON

    def __init__(self, clock: SteppedClock, latency_steps: int = 0, latency_s: float = 0.0) -> None:
        super().__init__()
        self.clock, self.latency_steps, self.latency_s = clock, latency_steps, latency_s
        self.bias = nn.Parameter(torch.zeros(()))  # something for load_state_dict to swap
        self.calls_in_thread: set[str] = set()

    def act_chunk(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        self.calls_in_thread.add(threading.current_thread().name)
        planned_at = int(obs["step"][0, 0])
        if self.latency_steps and planned_at > 0:
            self.clock.wait_for(planned_at + self.latency_steps)
        time.sleep(self.latency_s)
        actions = planned_at * 100 + torch.arange(HORIZON, dtype=torch.float32) + self.bias.detach()
        return actions.view(1, HORIZON, 1)


def run_loop(
    runner: AsyncChunkRunner, clock: SteppedClock, steps: int, versions: list[int] | None = None
) -> tuple[list[float], list[float]]:
    """A 50 Hz control loop: (executed actions, the robot-side time of each step); `versions` gets the
    policy version each step's action came from."""
    executed, stamps = [], []
    next_tick = time.monotonic()
    for _ in range(steps):
        action, _ = runner({"step": np.array([clock.steps], np.float32)})
        executed.append(float(action[0]))
        if versions is not None:
            versions.append(runner.version)
        stamps.append(time.monotonic())  # the robot steps
        clock.tick()
        next_tick = max(next_tick + PERIOD_S, time.monotonic())  # late: the next period starts now
        time.sleep(max(0.0, next_tick - time.monotonic()))
    return executed, stamps


def finish(runner: AsyncChunkRunner, clock: SteppedClock) -> None:
    clock.stop()
    runner.close()


@pytest.mark.parametrize("latency_steps", [1, 3])
def test_with_an_inference_latency_of_d_steps_the_new_chunk_runs_from_its_step_d(latency_steps: int) -> None:
    clock = SteppedClock()
    runner = AsyncChunkRunner(SlowChunkPolicy(clock, latency_steps=latency_steps), period_s=PERIOD_S)
    try:
        executed, _ = run_loop(runner, clock, 60)
    finally:
        finish(runner, clock)
    planned_at = [int(a) // 100 for a in executed]
    index = [int(round(a)) % 100 for a in executed]
    # The first chunk is waited for (nothing to run yet) and runs from its start ...
    assert index[0] == 0 and planned_at[0] == 0
    # ... every later one runs from the step it was planned for: planned at k, used from k + d at index d.
    switches = [t for t in range(1, len(executed)) if planned_at[t] != planned_at[t - 1]]
    assert len(switches) >= 5
    for t in switches:
        assert index[t] == latency_steps and t == planned_at[t] + latency_steps, (t, executed[t - 2 : t + 2])
    assert all(index[t] == t - planned_at[t] for t in range(len(executed)))  # never an action out of its time
    assert runner.starved_steps == 0 and runner.stale_chunks == 0


def test_slow_inference_never_stalls_the_control_period() -> None:
    clock = SteppedClock()
    policy = SlowChunkPolicy(clock, latency_s=3 * PERIOD_S)  # 60 ms: three control periods per inference
    runner = AsyncChunkRunner(policy, period_s=PERIOD_S)
    try:
        executed, stamps = run_loop(runner, clock, 100)
    finally:
        finish(runner, clock)
    periods = np.diff(stamps[1:])  # from the second step: the first waited for the first chunk
    print(
        f"\n50 Hz with 60 ms inferences: period p50 {1000 * np.median(periods):.1f} ms, "
        f"max {1000 * periods.max():.1f} ms; {runner.inferences} inferences, lead {runner.lead_steps()} steps"
    )
    assert periods.max() < PERIOD_S + 0.010, periods  # a synchronous inference would take 60 ms here
    assert runner.inferences >= 100 // HORIZON and runner.starved_steps == 0
    assert policy.calls_in_thread == {n for n in policy.calls_in_thread if n.startswith("chunk-inference")}
    assert runner.status()["inference_ms"] == pytest.approx(60, abs=15)


def test_an_inference_longer_than_a_chunk_waits_and_says_so() -> None:
    clock = SteppedClock()
    runner = AsyncChunkRunner(SlowChunkPolicy(clock, latency_s=(HORIZON + 2) * PERIOD_S), period_s=PERIOD_S)
    try:
        executed, _ = run_loop(runner, clock, 30)
    finally:
        finish(runner, clock)
    assert runner.starved_steps > 0
    planned_at = [int(a) // 100 for a in executed]
    assert all(0 <= t - planned_at[t] < HORIZON for t in range(len(executed)))  # never an action past its chunk


def test_weights_are_swapped_by_the_worker_between_inferences() -> None:
    clock = SteppedClock()
    policy = SlowChunkPolicy(clock, latency_s=0.005)
    runner = AsyncChunkRunner(policy, period_s=PERIOD_S)
    versions: list[int] = []
    try:
        runner.swap({"bias": torch.tensor(0.0)}, version=3)
        before, _ = run_loop(runner, clock, 10, versions)
        runner.swap({"bias": torch.tensor(0.5)}, version=7)
        executed, _ = run_loop(runner, clock, 3 * HORIZON, versions)
    finally:
        finish(runner, clock)
    # Chunks inferred after the swap carry the new bias; none is half old, half new.
    fractions = {round(a % 1, 2) for a in executed}
    assert 0.5 in fractions and fractions <= {0.0, 0.5}
    assert executed.index(next(a for a in executed if round(a % 1, 2) == 0.5)) <= HORIZON
    # Each step names the version that planned its action (what the edge stamps on the row), not the
    # newest one received: the old chunk runs out under the old version.
    assert versions == [7 if round(a % 1, 2) == 0.5 else 3 for a in before + executed]
    assert versions[10] == 3


def test_the_in_loop_runner_also_names_the_version_that_planned_each_action() -> None:
    clock = SteppedClock()
    runner = ChunkRunner(SlowChunkPolicy(clock))
    runner.swap({"bias": torch.tensor(0.0)}, version=3)
    versions = []
    for step in range(3 * HORIZON):
        if step == HORIZON + 2:
            runner.swap({"bias": torch.tensor(0.5)}, version=7)  # two actions into the second chunk
        runner({"step": np.array([step], np.float32)})
        versions.append(runner.version)
    assert versions == [3] * (2 * HORIZON) + [7] * HORIZON


def test_a_failing_inference_raises_in_the_control_loop() -> None:
    class Broken(nn.Module):
        chunk_length = HORIZON

        def act_chunk(self, obs, deterministic=False):
            raise RuntimeError("CUDA out of memory")

    runner = AsyncChunkRunner(Broken())
    try:
        with pytest.raises(RuntimeError, match="CUDA out of memory"):
            runner({"step": np.zeros(1, np.float32)})
    finally:
        runner.close()


@pytest.mark.parametrize("horizon", [1, 4])
def test_without_a_clock_each_chunk_runs_from_its_start_one_inference_per_chunk(horizon: int) -> None:
    """A loop with no clock of its own (a sim stepped as fast as it goes, the edge on a GPU) waits for
    each chunk: it must plan it from the observation of the step it starts at and run it from index 0,
    and infer once per H steps (not once more a chunk, thrown away, for H = 1 twice a step)."""

    class StepChunks(nn.Module):
        chunk_length = horizon

        def act_chunk(self, obs, deterministic=False):
            return (obs["step"][0, 0] * 100 + torch.arange(horizon, dtype=torch.float32)).view(1, horizon, 1)

    runner = AsyncChunkRunner(StepChunks())  # period_s None: no clock
    steps = 6 * horizon
    try:
        executed = [float(runner({"step": np.array([step], np.float32)})[0][0]) for step in range(steps)]
    finally:
        runner.close()
    planned_at = [int(a) // 100 for a in executed]
    index = [int(round(a)) % 100 for a in executed]
    assert index == [t % horizon for t in range(steps)], executed  # every chunk from its first action
    assert planned_at == [t - t % horizon for t in range(steps)], executed  # from the step it starts at
    assert runner.inferences == steps // horizon and runner.stale_chunks == 0
