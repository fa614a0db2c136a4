"""Idle take-overs (issue 33, point 5): a driver who commands no motion for
`teleop.idle_hand_back_s` is handed back, and their page says why; the steps they held nothing on
are flagged idle and never reach sampling as demonstrations (`teleop.idle_rows: drop`, the
default); the hand-back moves a position-controlled arm no further than any step may.

The real teleop server: driven over a real websocket for the LeRobot arm of absolute position goals
(no learner: the policy acts randomly, its warm-up), and from headless Chromium for a MuJoCo reach
arm streaming to a real learner, whose buffer is sampled."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import aiohttp
import numpy as np
import torch
import zmq
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

from tests.edge.test_teleop_browser import browser, text  # noqa: F401  (a fixture)
from tests.edge.test_teleop_connection import take_over
from tests.edge.test_teleop_takeover import HZ as ARM_HZ
from tests.edge.test_teleop_takeover import START, ServoArm, Step, edge_without_learner
from tests.support.teleop import teleop_fleet
from user_rl.algos.base import imitation_weights
from user_rl.algos.bc import BehaviourCloning
from user_rl.cloud.batches import training_columns
from user_rl.cloud.buffer.rows import KIND_RECORD
from user_rl.config_sections import TeleopConfig
from user_rl.edge.daemon import EdgeSettings
from user_rl.edge.teleop import make_source, start_server
from user_rl.hal.lerobot.robot import LeRobotRobot
from user_rl.robots.safety import SafetySettings
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb

IDLE_S = 1.5  # teleop.idle_hand_back_s over the websocket
PAGE_IDLE_S = 3.0  # and from the page (a loaded box may take a second between a click and a key)
HZ = 20.0


async def drive_then_let_go(url: str) -> tuple[dict, float, float]:
    """As a page does over its websocket: take over, hold j1 + for 0.5 s (the command refreshed),
    let go, and wait to be told. Returns (the message, when she let go, when it came)."""
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"type": "hello", "name": "alice"})
        await ws.send_json({"type": "take_over"})
        for _ in range(5):
            await ws.send_json({"type": "command", "id": 1, "action": [1.0, 0.0, 0.0]})
            await asyncio.sleep(0.1)
        await ws.send_json({"type": "command", "id": 2, "action": [0.0, 0.0, 0.0]})
        let_go = time.monotonic()
        deadline = let_go + IDLE_S + 10.0
        while time.monotonic() < deadline:
            message = await ws.receive(timeout=deadline - time.monotonic())
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(message.data)
            if data["type"] == "handed_back":
                return data, let_go, time.monotonic()
        raise AssertionError("no handed_back message")


def test_an_idle_driver_of_a_position_arm_is_handed_back_without_a_jump() -> None:
    robot = LeRobotRobot(
        ServoArm(),
        robot_id="arm-0",
        control_hz=ARM_HZ,
        episode_steps=100_000,
        reset="pose",
        reset_pose=START,
        reset_s=0.0,
    )
    teleop = TeleopConfig(enabled=True, speed=0.5, idle_hand_back_s=IDLE_S)
    source = make_source(robot, teleop, None, ARM_HZ)
    context = zmq.Context()
    settings = EdgeSettings(control_hz=ARM_HZ, safety=SafetySettings())
    edge = edge_without_learner(robot, source, settings, context)  # random goals anywhere in the joints' range
    steps: list[tuple[float, bool, Step]] = []  # (time.monotonic(), idle, the step)
    pose = [np.array(list(START.values()))]

    def watch(record) -> None:
        after = record.obs["state"].astype(np.float64)
        steps.append(
            (time.monotonic(), record.idle, Step(record.actor, pose[0], record.action.astype(np.float64), after))
        )
        pose[0] = after

    edge.step_watchers.append(watch)
    server = start_server(edge, source, teleop)
    loop = threading.Thread(target=edge.run, daemon=True)
    try:
        loop.start()
        told, let_go, came = asyncio.run(drive_then_let_go(server.url.replace("/?", "/ws?")))
        time.sleep(0.5)  # the policy's first steps after the hand-back
    finally:
        edge.stop()
        loop.join(10)
        edge.close()
        context.term()
    assert told["reason"] == "idle" and told["idle_s"] >= IDLE_S
    assert f"you held nothing for {IDLE_S:g} s" in told["message"] and "policy drives again" in told["message"]
    assert source.driver == (None, "") and source.idle_hand_backs == 1
    person = [(t, idle, s) for t, idle, s in steps if s.actor == pb.ACTOR_HUMAN]
    after = [s for t, _, s in steps if t > person[-1][0]]
    moved = [s for _, idle, s in person if not idle]
    held = [s for t, idle, s in person if idle and t > let_go + 0.2]
    assert len(moved) >= 5 and all(s.goal[0] > s.before[0] for s in moved)  # j1 +: her steps, not idle
    assert len(held) >= 0.5 * (IDLE_S - 0.4) * ARM_HZ and all(idle for t, idle, _ in person if t > let_go + 0.2)
    for s in held:  # holding nothing keeps the pose: the goal is where the arm is
        np.testing.assert_allclose(s.goal, s.before, atol=1e-3)
    assert IDLE_S - 0.3 <= person[-1][0] - let_go <= IDLE_S + 1.0  # handed back after idle_hand_back_s
    assert len(after) >= 5 and all(s.actor == pb.ACTOR_WARMUP for s in after)
    # The policy's random goals are anywhere in +-90 degrees; the safety filter keeps each step within
    # the per-step limit of where the arm is, from the first step after the hand-back on.
    limit = edge.safety.max_delta
    jumps = np.array([np.abs(s.goal - s.before) for s in after])
    assert (jumps <= limit + 1e-3).all(), (jumps.max(axis=0), limit)
    assert (np.array([np.abs(s.after - s.before) for _, _, s in steps]) <= limit + 1e-3).all()
    assert jumps.max() > 0.5 * limit.max()  # the random policy did push against the limit
    print(
        f"\n{len(moved)} steps driven, {len(held)} holding nothing, handed back {person[-1][0] - let_go:.2f} s after "
        f"she let go (told {came - let_go:.2f} s after); the policy's {len(after)} steps after it moved a joint "
        f"at most {jumps.max():.3f} deg (limit {limit.max():.3f} deg/step)"
    )


def test_an_idle_driver_is_handed_back_told_why_and_their_rows_are_never_demonstrations(
    running,
    browser,  # noqa: F811
) -> None:
    learner, (edge,) = running(
        teleop_fleet(
            1,
            HZ,
            "fleet.batch_transitions=8",
            "teleop.frame_hz=2",
            "teleop.view_size=32",
            "teleop.speed=1.0",
            f"teleop.idle_hand_back_s={PAGE_IDLE_S}",
        ),
        {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 100, "control_hz": HZ}},
    )
    steps: list[tuple[float, int, bool, np.ndarray]] = []  # (time.monotonic(), actor, idle, action)
    lock = threading.Lock()

    def watch(record) -> None:
        with lock:
            steps.append((time.monotonic(), record.actor, record.idle, record.action.copy()))

    edge.step_watchers.append(watch)
    alice = browser()
    alice.get(edge.teleop.url + "&name=alice")
    take_over(alice, edge, "alice")
    wait_until(lambda: text(alice, "driver") == "teleop:alice (you)", 10, "alice to drive")
    ActionChains(alice).key_down("d").perform()  # she drives ...
    time.sleep(0.6)
    ActionChains(alice).key_up("d").perform()  # ... then lets go and holds nothing
    let_go = time.monotonic()
    wait_until(lambda: edge.teleop.source.driver == (None, ""), PAGE_IDLE_S + 10, "the idle driver to be handed back")
    handed_back = time.monotonic()
    # Her page says why, shows the policy driving, and lets her take over again.
    wait_until(lambda: f"you held nothing for {PAGE_IDLE_S:g} s" in text(alice, "message"), 10, "the page to say why")
    assert "policy drives again" in text(alice, "message")
    wait_until(lambda: text(alice, "driver") == "policy", 10, "the page to show the policy")
    assert alice.find_element(By.ID, "take-over").is_enabled()
    time.sleep(0.5)
    with lock:
        seen = list(steps)
    person = [(t, idle, a) for t, actor, idle, a in seen if actor == pb.ACTOR_HUMAN]
    moving = [a for _, idle, a in person if not idle]
    assert len(moving) >= 5 and all(a[0] > 0 and not a[1:].any() for a in moving)  # D held: steps not idle
    held = [(idle, a) for t, idle, a in person if t > let_go + 0.3]
    assert len(held) >= 0.5 * (PAGE_IDLE_S - 0.3) * HZ and all(idle and not a.any() for idle, a in held)
    assert PAGE_IDLE_S - 0.5 <= person[-1][0] - let_go <= handed_back - let_go
    assert all(actor != pb.ACTOR_HUMAN for t, actor, _, _ in seen if t > person[-1][0])
    assert edge.status()["interventions"]["idle_steps"] == sum(idle for _, idle, _ in person)

    # Her rows reach the learner's buffer with the flag; sampling (idle_rows: drop) never draws the
    # idle ones, so no zero-action row weighs as a demonstration.
    buffer = learner.buffer
    flat = buffer.cache.flat

    def stored() -> tuple[int, int]:
        person_rows = (flat["actor"] == pb.ACTOR_HUMAN) & (flat["kind"] == KIND_RECORD)
        return int(person_rows.sum()), int((person_rows & flat["idle"]).sum())

    wait_until(lambda: stored() == (len(person), len(person) - len(moving)), 30, "her rows in the buffer")
    assert buffer.settings.idle_rows == "drop"
    rng = np.random.default_rng(0)
    drawn = 0
    for _ in range(20):
        batch = buffer.sample(256, rng)
        assert not batch["idle"].any()
        columns = training_columns(batch, BehaviourCloning.batch_columns, buffer.idle_weight)
        weights = imitation_weights({k: torch.as_tensor(v) for k, v in columns.items() if k != "obs"}, 0.0, prefix="")
        demonstrations = weights.numpy() > 0
        assert (batch["actor"][demonstrations] == pb.ACTOR_HUMAN).all()
        assert np.abs(batch["action"][demonstrations]).sum(1).min(initial=1.0) > 0
        drawn += int(demonstrations.sum())
    assert drawn > 0  # her moving steps are drawn as demonstrations
    print(
        f"\n{len(moving)} steps driven, {len(person) - len(moving)} holding nothing (flagged idle, never drawn), "
        f"handed back {person[-1][0] - let_go:.2f} s after she let go; {drawn} demonstration rows in 20 batches"
    )
