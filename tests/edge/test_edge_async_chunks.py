"""A slow chunk policy on a 50 Hz edge: with asynchronous chunks the robot is stepped every period
while the next chunk is inferred; inferring in the loop stalls it once per chunk. Measured where a
robot would notice: the times at which the robot's own `step` is called. A standalone learner
process trains the policy and publishes weights meanwhile, and shows the edge's inference latency
and control-loop jitter from its heartbeats."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.e2e.harness import learner_status, start_learner
from user_rl.edge.daemon import EdgeDaemon, EdgeSettings
from user_rl.policies.flow import FlowChunkActor
from user_rl.sim.reach import ReachRobot
from user_rl.testing.wait import wait_until

CONTROL_HZ = 50
PERIOD_S = 1 / CONTROL_HZ
CHUNK = 10
INFERENCE_S = 0.06  # three control periods
STALL_S = PERIOD_S + INFERENCE_S / 2  # an interval this long is the loop waiting on an inference
CONFIG = {
    "robot": {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 100}},
    "policy": {"type": "flow", "hidden": [32], "chunk": CHUNK, "flow_steps": 2},
    "algo": {"type": "bc", "learning_starts": 100, "batch_size": 16},
    "buffer": {"mix": {"online": 1.0}},
    "learner": {"publish_every_updates": 20, "torch_threads": 1},
    "fleet": {"num_robots": 1, "pace_to_learner": False, "control_hz": CONTROL_HZ, "batch_transitions": 16},
}


class TimedReach(ReachRobot):
    """The reach sim, noting when each step is asked of it (None marks a reset: a new episode)."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.stamps: list[float | None] = []

    def reset(self, seed=None):
        self.stamps.append(None)
        return super().reset(seed)

    def step(self, action):
        self.stamps.append(time.monotonic())
        return super().step(action)


class SlowFlow(FlowChunkActor):
    """A flow chunk policy whose every inference takes INFERENCE_S longer (a big model's latency)."""

    def act_chunk(self, obs, deterministic: bool = False):
        time.sleep(INFERENCE_S)
        return super().act_chunk(obs, deterministic)


def intervals_while_the_policy_drives(robot: TimedReach, edge: EdgeDaemon, steps: int) -> np.ndarray:
    """Robot-side intervals between steps within episodes, over `steps` steps once weights arrived."""
    wait_until(lambda: edge.policy_version >= 1, 90, "the policy's first weights")
    first = len(robot.stamps)
    wait_until(lambda: len(robot.stamps) >= first + steps, 60, f"{steps} steps")
    stamps = robot.stamps[first : first + steps]
    return np.array([b - a for a, b in zip(stamps, stamps[1:]) if a is not None and b is not None])


def run_edge(tmp_path: Path, async_chunks: bool, steps: int = 300) -> tuple[np.ndarray, dict, dict]:
    """(robot-side step intervals, the edge's status, the learner's view of the robot)."""
    tmp_path.mkdir()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    with open(tmp_path / "learner.log", "w") as log:
        learner = start_learner(tmp_path / "config.yaml", tmp_path / "run", log)
    try:
        addresses = json.loads((tmp_path / "run" / "addresses.json").read_text())
        robot = TimedReach(robot_id="slow-0", obs_mode="state", episode_steps=100)
        actor = SlowFlow(robot.observation_space, robot.action_space, hidden=[32], chunk=CHUNK, flow_steps=2)
        settings = EdgeSettings(control_hz=CONTROL_HZ, batch_transitions=16, async_chunks=async_chunks)
        edge = EdgeDaemon(robot, actor, addresses["data"], addresses["weights"], settings)
        loop = threading.Thread(target=edge.run, daemon=True)
        loop.start()
        try:
            intervals = intervals_while_the_policy_drives(robot, edge, steps)
            wait_until(
                lambda: (
                    learner_status(tmp_path / "run")["robots"]
                    .get("slow-0", {})
                    .get("inference", {})
                    .get("latency_ms", 0)
                    > 0
                    or not async_chunks
                ),
                30,
                "the learner to hear the edge's latency",
            )
            seen = learner_status(tmp_path / "run")["robots"]["slow-0"]
            status = edge.status()
        finally:
            edge.stop()
            loop.join(30)
            edge.close()
    finally:
        learner.terminate()
        learner.wait(30)
    return intervals, status, seen


@pytest.mark.timeout(300)
def test_slow_inference_never_stalls_a_50_hz_control_loop(tmp_path: Path) -> None:
    intervals, status, seen = run_edge(tmp_path / "async", async_chunks=True)
    off = np.abs(intervals - PERIOD_S) > 0.010  # late, or early (a burst to catch up)
    print(
        f"\nasync chunks, 60 ms inferences at 50 Hz: robot-side interval p50 {1000 * np.median(intervals):.1f} ms, "
        f"p99 {1000 * np.percentile(intervals, 99):.1f} ms, max {1000 * intervals.max():.1f} ms; "
        f"edge: {status['inference_ms']} ms inference, jitter p99 {status['loop_jitter_p99_ms']} ms"
    )
    assert len(intervals) > 250
    # Inferring in the loop stalls it once per chunk: about 27 of 294 intervals over 50 ms (the sync
    # run below). Here at most 1% are (OS hiccups, a tenth of the sync rate), and jitter past 10 ms
    # is rare: on a 2-core machine that also runs the learner, the OS now and then delays a step by
    # 20-30 ms (and the next one catches up), which once made 4 of 293 intervals (1.4%) miss by more
    # than 10 ms, and once (in CI) 2 of 299 intervals went over 50 ms (57 and 89 ms).
    stalls = intervals > STALL_S
    assert stalls.mean() <= 0.01 and intervals.max() < 2 * INFERENCE_S, np.sort(intervals)[-5:]
    assert off.mean() < 0.03, np.sort(intervals)[[0, 1, -2, -1]]
    assert status["starved_steps"] == 0
    assert status["inference_ms"] == pytest.approx(1000 * INFERENCE_S, abs=30)
    # The learner hears it all in the heartbeats.
    assert seen["inference"]["latency_ms"] == pytest.approx(1000 * INFERENCE_S, abs=30)
    # p99 jitter: under half a stall (an edge inferring in the loop shows 60 ms)
    assert seen["inference"]["loop_jitter_p99_ms"] < 30 and seen["inference"]["starved_steps"] == 0
    assert 0 <= seen["inference"]["chunk_age_steps"] < CHUNK

    # The same policy inferred in the loop: the robot waits 60 ms once per chunk.
    intervals, _, _ = run_edge(tmp_path / "sync", async_chunks=False)
    stalls = intervals > STALL_S
    print(f"in the loop: {stalls.sum()} of {len(intervals)} intervals over {1000 * STALL_S:.0f} ms")
    assert stalls.mean() > 0.5 / CHUNK
