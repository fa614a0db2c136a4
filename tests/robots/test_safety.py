"""The safety layer between a policy and a robot: a hostile policy (NaN, huge, jerky, pushing at
joint limits and out of the workspace) never reaches the sim arm unfiltered, every intervention
is counted and reported in the heartbeat, and a stalled policy gets the arm held in time."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from pathlib import Path

import numpy as np
import torch
import zmq

from tests.support.edges import edge_without_learner, small_actor
from user_rl.config import build_config
from user_rl.edge.daemon import EdgeDaemon, EdgeSettings
from user_rl.edge.link import LinkSettings
from user_rl.robots.safety import ActionFilter, SafetySettings
from user_rl.sim.reach import ReachRobot
from user_rl.testing.learner import serving_learner
from user_rl.testing.wait import wait_until
from user_rl.wire.codec import decode


class RecordingArm(ReachRobot):
    """The reach arm, noting every action that reaches it and when."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.received: list[np.ndarray] = []
        self.step_times: list[float] = []

    def step(self, action: np.ndarray):
        self.received.append(np.array(action, copy=True))
        self.step_times.append(time.monotonic())
        return super().step(action)


class HostileActor(torch.nn.Module):
    """Wraps a real actor (so published weights load into it) and replaces its actions by a script."""

    def __init__(self, inner: torch.nn.Module, script) -> None:
        super().__init__()
        self.inner = inner
        self.script = script
        self.calls = 0

    def load_state_dict(self, state, strict: bool = True):  # weights from the learner go to the real actor
        return self.inner.load_state_dict(state, strict)

    def act(self, batch, deterministic: bool = False) -> torch.Tensor:
        self.calls += 1
        return torch.as_tensor(self.script(self.calls), dtype=torch.float32).unsqueeze(0)


def offline_edge(robot: ReachRobot, script, safety: SafetySettings, context: zmq.Context) -> EdgeDaemon:
    """An unpaced edge with no learner (it keeps its batches), acting with `script` from the first step."""
    settings = EdgeSettings(pace_to_learner=False, batch_transitions=50, safety=safety)
    edge = edge_without_learner(robot, settings, context, HostileActor(small_actor(robot), script))
    edge.policy_version = 0  # act with the (hostile) policy at once, not random warm-up actions
    return edge


def test_nan_huge_and_jerky_actions_never_reach_the_arm(tmp_path: Path) -> None:
    garbage = [
        np.full(3, np.nan),
        np.array([np.inf, 0, 0]),
        np.full(3, 1e9),
        np.full(3, -1e30),
        np.array([1.0, -1.0, 1.0]),
        np.array([-1.0, 1.0, -1.0]),
    ]
    context = zmq.Context()
    robot = RecordingArm(robot_id="hostile", seed=0)
    edge = offline_edge(robot, lambda n: garbage[n % len(garbage)], SafetySettings(max_action_delta=0.25), context)
    status = edge.run(max_steps=300)
    edge.close()
    context.term()
    received = np.array(robot.received)
    assert len(received) == 300 and np.isfinite(received).all()
    assert (np.abs(received) <= 1.0).all()
    assert (np.abs(np.diff(received, axis=0)) <= 0.25 + 1e-6).all()  # no jerks, even across the holds
    counts = status["safety_violations"]
    assert counts["non_finite"] == 100 and counts["clipped"] == 100 and counts["rate_limited"] > 0


def test_joint_limits_and_workspace_from_the_descriptor_are_kept() -> None:
    import mujoco

    robot = ReachRobot(seed=3, episode_steps=100)
    robot.reset(seed=3)
    robot.data.qpos[:] = robot.data.ctrl[:] = [0.0, 0.3, 0.8]  # upright-ish, elbow inside its limits
    mujoco.mj_forward(robot.model, robot.data)
    # Tighter limits than the servos' own: an elbow kept within (0.3, 1.2) rad, a fingertip kept above 12 cm.
    limits = list(robot.descriptor.joint_limits)
    limits[2] = (0.3, 1.2)
    robot.descriptor = dataclasses.replace(
        robot.descriptor, joint_limits=tuple(limits), workspace=((-0.6, 0.6), (-0.6, 0.6), (0.12, 0.7))
    )
    safety = ActionFilter(robot.action_space, SafetySettings(), robot)

    def outside(elbow: float) -> float:
        return max(0.3 - elbow, elbow - 1.2, 0.0)

    lowest = np.inf
    for direction in ([0.0, 0.0, 1.0], [0.0, 0.0, -1.0], [0.0, 1.0, 1.0]):
        for _ in range(30):  # push the elbow one way, then the other, then fold the arm towards the floor
            action = safety(np.array(direction))
            target = robot.predict(action)[0][2]
            # No command takes the elbow out of its range, or further out than the servo already settled.
            assert outside(target) <= outside(robot.data.qpos[2]) + 1e-6  # (float32 actions)
            robot.step(action)
            assert outside(robot.data.qpos[2]) < 2e-3  # (servo settling at the limit: under 0.1 degree)
            lowest = min(lowest, robot.ee_pos[2])
    assert safety.violations["joint_limit"] > 0 and safety.violations["workspace"] > 0
    assert lowest >= 0.12 - 0.01  # held at the box's floor (servo settling: 1 cm)


def test_a_stalled_policy_gets_the_arm_held_within_the_deadline() -> None:
    context = zmq.Context()
    robot = RecordingArm(robot_id="stall", seed=0)

    def script(n: int) -> np.ndarray:
        if n == 40:
            time.sleep(1.0)  # inference hangs (a GPU hiccup, a swapped-out model)
        return np.zeros(3)

    edge = offline_edge(robot, script, SafetySettings(deadline_s=0.2), context)
    status = edge.run(max_steps=80)
    edge.close()
    context.term()
    assert status["watchdog_holds"] == 1 and len(robot.holds) == 1
    before = max(t for t in robot.step_times if t < robot.holds[0])
    assert 0.2 <= robot.holds[0] - before <= 0.2 + 0.15  # held within the deadline (+ the watchdog's tick)
    assert all(
        b - a < 0.2 for a, b in zip(robot.step_times, robot.step_times[1:]) if b < robot.holds[0] or a > robot.holds[0]
    )


def test_violations_and_holds_reach_the_learner_in_the_heartbeat(tmp_path: Path) -> None:
    cfg = build_config(
        {
            "robot": {"type": "mujoco_reach"},
            "fleet": {"num_robots": 1, "pace_to_learner": False, "heartbeat_s": 0.2},
            "policy": {"hidden": [16]},
            "learner": {"torch_threads": 1},
        }
    )
    with serving_learner(cfg, tmp_path / "run") as learner:
        context = zmq.Context()
        robot = RecordingArm(robot_id="reported", seed=0)
        edge = EdgeDaemon(
            robot,
            HostileActor(small_actor(robot), lambda n: np.full(3, np.nan if n % 2 else 5.0)),
            learner.addresses["data"],
            learner.addresses["weights"],
            EdgeSettings(pace_to_learner=False, control_hz=100, heartbeat_s=0.2),
            context,
        )
        edge.policy_version = 0
        runner = threading.Thread(target=edge.run, daemon=True)
        runner.start()
        try:

            def reported() -> dict:
                return learner.status().get("robots", {}).get("reported", {}).get("safety_violations", {})

            wait_until(
                lambda: reported().get("non_finite", 0) >= 50 and reported().get("clipped", 0) >= 50,
                60,
                "the learner to hear of the filtered actions",
            )
            assert learner.status()["robots"]["reported"]["watchdog_holds"] == 0
        finally:
            edge.stop()
            runner.join(30)
            edge.close()
            context.term()


def test_estop_holds_until_rearmed_even_across_an_edge_restart(tmp_path: Path) -> None:
    import subprocess
    import sys

    spool_root = tmp_path / "spool"

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "user_rl.cli", *args, "--spool", str(spool_root)],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start() -> tuple[EdgeDaemon, RecordingArm, threading.Thread]:
        robot = RecordingArm(robot_id="arm-e", seed=0)
        settings = EdgeSettings(
            pace_to_learner=False, control_hz=100, link=LinkSettings(spool_dir=str(spool_root / "arm-e"))
        )
        edge = edge_without_learner(robot, settings, context)
        runner = threading.Thread(target=edge.run, daemon=True)
        runner.start()
        return edge, robot, runner

    context = zmq.Context()
    edge, robot, runner = start()
    wait_until(lambda: edge.steps > 20, 30, "the arm to move")
    assert "arm-e: EMERGENCY STOP (gripper jammed)" in cli("estop", "arm-e", "--reason", "gripper jammed")
    wait_until(lambda: robot.holds, 2, "the arm to be held")
    stopped_at = len(robot.received)
    time.sleep(1.0)
    assert len(robot.received) == stopped_at and edge.status()["estopped"] == "gripper jammed"

    edge.stop()  # the edge restarts while stopped: it comes back stopped
    runner.join(10)
    edge.close()
    edge, robot, runner = start()
    time.sleep(1.0)
    assert robot.received == [] and edge.status()["estopped"] == "gripper jammed"

    assert "arm-e: re-armed" in cli("rearm", "arm-e")
    wait_until(lambda: len(robot.received) > 20, 10, "the arm to move again after re-arming")
    edge.stop()
    runner.join(10)
    edge.close()
    context.term()


# -- robot calls never overlap; a failed hold is reported; a stop ends the episode ------------------
class CallLog(RecordingArm):
    """The reach arm, logging when each reset / step / hold ran, so overlaps can be checked; steps
    listed in `stalls` hang that long (a servo bus timeout), and `hold_raises` makes every hold fail."""

    def __init__(self, stalls: dict[int, float] | None = None, hold_raises: bool = False, **options) -> None:
        super().__init__(**options)
        self.calls: list[tuple[str, float, float]] = []
        self.stalls = stalls or {}
        self.hold_raises = hold_raises

    def _logged(self, name: str, call, *args, **kwargs):
        start = time.monotonic()
        try:
            return call(*args, **kwargs)
        finally:
            self.calls.append((name, start, time.monotonic()))

    def step(self, action: np.ndarray):
        def stepping():
            time.sleep(self.stalls.get(len(self.received) + 1, 0.0))
            return super(CallLog, self).step(action)

        return self._logged("step", stepping)

    def reset(self, seed=None):
        return self._logged("reset", super().reset, seed)

    def hold(self) -> None:
        def holding():
            super(CallLog, self).hold()
            if self.hold_raises:
                raise RuntimeError("servo bus: no answer to the hold command")

        self._logged("hold", holding)

    def overlaps(self) -> list[tuple]:
        ordered = sorted(self.calls, key=lambda c: c[1])
        return [(a, b) for a, b in zip(ordered, ordered[1:]) if b[1] < a[2]]


def spooled(edge: EdgeDaemon) -> list[tuple[int, int, str, dict[str, np.ndarray]]]:
    """(seq, count, end_reason, columns) of every batch in the edge's spool, in order."""
    link = edge.link
    out = []
    for epoch, seq in link.spool.pending(link.epoch):
        msg = decode(link.spool.load(epoch, seq))
        out.append((seq, msg.body.count, msg.body.end_reason, msg.arrays))
    return out


def episode_steps_in_order(batches) -> list[tuple[int, int]]:
    return [(int(e), int(s)) for _, count, _, cols in batches if count for e, s in zip(cols["episode"], cols["step"])]


def test_a_hold_that_raises_is_reported_and_the_watchdog_keeps_watching(caplog) -> None:
    context = zmq.Context()
    robot = CallLog(hold_raises=True, robot_id="bad-hold", seed=0, episode_steps=100)

    def script(n: int) -> np.ndarray:
        if n in (30, 60):
            time.sleep(0.6)  # the policy stalls twice: two holds, both fail
        return np.zeros(3)

    edge = offline_edge(robot, script, SafetySettings(deadline_s=0.2), context)
    status = edge.run(max_steps=100)
    alive = edge.watchdog.alive
    edge.close()
    context.term()
    print(f"holds {status['watchdog_holds']}, violations {status['safety_violations']}, last: {status['hold_error']}")
    assert alive, "the watchdog thread died"
    assert status["watchdog_holds"] == 2 and len(robot.holds) == 2  # it tried both times: it kept watching
    assert status["safety_violations"]["hold_failed"] == 2
    assert status["hold_error"] == "watchdog: RuntimeError: servo bus: no answer to the hold command"
    failed = [r for r in caplog.records if "could not hold the robot" in r.getMessage()]
    assert len(failed) == 2 and all(r.exc_info for r in failed)  # logged with the traceback


def test_a_hold_never_runs_during_a_stalled_step_and_a_hold_ends_the_episode() -> None:
    context = zmq.Context()
    # Step 30 hangs past the deadline and the hold's wait (the hold gives up: reported); step 60 only past
    # the deadline (the hold waits for it, and is not needed once it returned); the policy stalls before
    # step 80 (no robot call in progress: held at once, so that episode ends there and a new one starts).
    robot = CallLog(stalls={30: 1.5, 60: 0.35}, robot_id="stalls", seed=0, episode_steps=100)

    def script(n: int) -> np.ndarray:
        if n == 80:
            time.sleep(0.5)
        return np.zeros(3)

    edge = offline_edge(robot, script, SafetySettings(deadline_s=0.2, hold_wait_s=0.5), context)
    status = edge.run(max_steps=100)
    batches = spooled(edge)
    edge.close()
    context.term()
    print(f"holds {status['watchdog_holds']}, violations {status['safety_violations']}, last: {status['hold_error']}")
    assert robot.overlaps() == [], "a hold ran during another robot call"
    assert status["watchdog_holds"] == 2 and len(robot.holds) == 1
    assert status["safety_violations"]["hold_failed"] == 1
    assert re.fullmatch(
        r"watchdog: HoldBlocked: a call to the robot \(a step or reset\) has not returned for "
        r"\d+\.\d\d s; not held",
        status["hold_error"],
    )
    # The hold before step 80 ended episode 0 there (a count-0 batch "hold" right after its last step) and
    # the robot was reset: episode 1 starts at step 0 with the step after it.
    ends = [(i, reason) for i, (_, count, reason, _) in enumerate(batches) if count == 0]
    assert [reason for _, reason in ends] == ["hold"]
    before = episode_steps_in_order(batches[: ends[0][0]])
    after = episode_steps_in_order(batches[ends[0][0] + 1 :])
    assert before == [(0, s) for s in range(79)] and after == [(1, s) for s in range(21)]
    assert [c[0] for c in robot.calls].count("reset") == 2 and status["episodes"] == 1


def test_an_estop_ends_the_episode_and_rearming_starts_a_new_one(tmp_path: Path) -> None:
    """The edge's half of "an e-stop ends the episode as truncated": a count-0 end batch with reason
    "estop" follows the last step before the stop, and after re-arming the robot is reset and a new
    episode (next number, step 0) begins. (tests/e2e/test_e2e_estop.py checks what the learner stores.)"""
    context = zmq.Context()
    robot = CallLog(robot_id="arm-s", seed=0, episode_steps=100)
    settings = EdgeSettings(
        control_hz=100,
        batch_transitions=16,
        safety=SafetySettings(deadline_s=0.5),
        link=LinkSettings(spool_dir=str(tmp_path / "arm-s")),
    )
    edge = edge_without_learner(robot, settings, context)
    runner = threading.Thread(target=edge.run, daemon=True)
    runner.start()
    wait_until(lambda: edge.steps >= 37, 30, "the arm to move")
    edge.estop.trip("operator")
    wait_until(lambda: robot.holds, 2, "the arm to be held")
    stopped_at = edge.steps
    time.sleep(0.5)
    assert edge.steps == stopped_at and edge.status()["episodes"] == 1  # episode 0 ended at the stop
    edge.estop.clear()
    wait_until(lambda: edge.steps >= stopped_at + 30, 10, "the arm to move again after re-arming")
    edge.stop()
    runner.join(10)
    batches = spooled(edge)
    edge.close()
    context.term()
    ends = [i for i, (_, count, _, _) in enumerate(batches) if count == 0]
    assert len(ends) == 1 and batches[ends[0]][2] == "estop"
    assert [seq for seq, *_ in batches] == list(range(1, len(batches) + 1))  # in order with the batches
    before, after = episode_steps_in_order(batches[: ends[0]]), episode_steps_in_order(batches[ends[0] + 1 :])
    assert before == [(0, s) for s in range(stopped_at)]
    assert after == [(1, s) for s in range(len(after))] and len(after) >= 30
    resets = [start for name, start, _ in robot.calls if name == "reset"]
    assert len(resets) == 2 and resets[1] > robot.holds[0]  # a new episode, from a reset after the stop
