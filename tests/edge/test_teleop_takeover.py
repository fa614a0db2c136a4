"""A take-over never moves the arm by itself (issue 29.1): a LeRobot arm, whose actions are absolute
`<motor>.pos` goals, taken over from the real teleop page in headless Chromium. Nothing held keeps
the current pose; a held key moves from it by at most the declared per-step limit.

The arm is `LeRobotRobot` (the real HAL driver of LeRobot robots) around `ServoArm`, a stand-in for
the `sim_arm` plugin of tests/lerobot/plugins with the same calibrated STS3215 bus, built without
LeRobot itself (which lives in a venv of its own, tests/lerobot/conftest.py). Its servos reach any
goal in one command, so every goal the edge sends shows as joint motion at once.
tests/lerobot/test_lerobot_takeover.py runs the same take-over with LeRobot's own `sim_arm` plugin."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import zmq
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

from user_rl.config_sections import TeleopConfig
from user_rl.edge.daemon import EdgeDaemon, EdgeSettings
from user_rl.edge.intervention import InterventionMux
from user_rl.edge.teleop import make_source, start_server
from user_rl.hal.lerobot.robot import LeRobotRobot
from user_rl.policies import make_actor
from user_rl.robots.safety import FULL_RANGE_S, SafetySettings
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"  # apt-get install chromium chromium-driver
HZ = 30.0
START = {"j1.pos": 30.0, "j2.pos": -45.0, "j3.pos": 60.0}  # degrees: far from zero
RANGE = (1024, 3072)  # raw servo steps of the calibrated range: +-90 degrees about the middle


class ServoArm:
    """Three position-controlled joints in degrees behind a calibrated Feetech bus, as LeRobot
    presents an SO arm; its servos reach any goal within their range in one command."""

    name = "servo_arm"

    def __init__(self) -> None:
        self.motors = ["j1", "j2", "j3"]
        degrees = SimpleNamespace(value="degrees")  # lerobot.motors.MotorNormMode.DEGREES
        motor = lambda i: SimpleNamespace(id=i, model="sts3215", norm_mode=degrees)  # noqa: E731
        self.calibration = {m: SimpleNamespace(range_min=RANGE[0], range_max=RANGE[1]) for m in self.motors}
        self.bus = SimpleNamespace(
            motors={m: motor(i + 1) for i, m in enumerate(self.motors)}, model_resolution_table={"sts3215": 4096}
        )
        self.id, self.is_connected, self.is_calibrated = "arm", True, True
        self.position = np.zeros(3)

    observation_features = property(lambda self: {f"{m}.pos": float for m in self.motors})
    action_features = property(lambda self: {f"{m}.pos": float for m in self.motors})

    def get_observation(self) -> dict:
        return {f"{m}.pos": float(p) for m, p in zip(self.motors, self.position)}

    def send_action(self, action: dict) -> dict:
        goal = np.clip([action.get(f"{m}.pos", p) for m, p in zip(self.motors, self.position)], -90.0, 90.0)
        self.position = goal
        return {f"{m}.pos": float(g) for m, g in zip(self.motors, goal)}

    def disconnect(self) -> None:
        self.is_connected = False


def chromium_driver(*flags: str) -> webdriver.Chrome:
    """Headless Chromium (with its own new profile), with `flags` besides the usual ones. This file
    imports nothing from `tests` (test_lerobot_takeover runs it in LeRobot's environment), so the
    teleop page's other tests take their browsers from here."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-timer-throttling",
        *flags,
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture
def chromium():
    driver = chromium_driver()
    yield driver
    driver.quit()


def edge_without_learner(robot, source, settings: EdgeSettings, context: zmq.Context) -> EdgeDaemon:
    """An edge whose learner never answers: its policy acts at random (warm-up), a person may take over."""
    actor = make_actor("mlp", robot.observation_space, robot.action_space, hidden=[16])
    return EdgeDaemon(
        robot,
        actor,
        "tcp://127.0.0.1:1",
        "tcp://127.0.0.1:1",
        settings,
        context,
        interventions=InterventionMux([source]),
    )


@dataclass
class Step:
    actor: int
    before: np.ndarray  # the joints when the action was chosen
    goal: np.ndarray  # what the robot was sent
    after: np.ndarray


def take_over(robot: LeRobotRobot, chromium: webdriver.Chrome) -> tuple[list[Step], list[Step], np.ndarray]:
    """A person takes over `robot` (at START after its reset) from the page, holds nothing for 2 s,
    then D (j1.pos +) for 1 s. Returns (the steps with nothing held, those with D held, the rate
    limit the edge's safety filter applies)."""
    settings = EdgeSettings(control_hz=HZ, safety=SafetySettings())  # no rate limit configured
    teleop = TeleopConfig(enabled=True, speed=0.5, command_timeout_s=0.5)
    source = make_source(robot, teleop, None, HZ)
    context = zmq.Context()
    edge = edge_without_learner(robot, source, settings, context)  # the policy would act randomly
    steps: list[Step] = []
    pose = [np.array(list(START.values()))]  # the joints now (reset drives to START)

    def watch(record) -> None:  # on the loop's thread, after each step
        after = record.obs["state"].astype(np.float64)
        steps.append(Step(record.actor, pose[0], record.action.astype(np.float64), after))
        pose[0] = after

    edge.step_watchers.append(watch)
    server = start_server(edge, source, teleop)
    loop = threading.Thread(target=edge.run, daemon=True)
    try:
        # The person takes over before the first step, so every step is theirs: what the arm does is
        # what the take-over does.
        chromium.get(server.url + "&name=alice")
        wait_until(lambda: chromium.find_element(By.ID, "connection").text == "connected", 30, "the page to connect")
        chromium.find_element(By.ID, "take-over").click()
        wait_until(lambda: source.driver[1] == "alice", 10, "alice to drive")
        wait_until(lambda: chromium.execute_script("return window.teleop.driving"), 10, "the page to drive")
        loop.start()
        wait_until(lambda: steps, 10, "the first step")
        time.sleep(2.0)  # nothing held
        pressed = len(steps)
        ActionChains(chromium).key_down("d").perform()
        time.sleep(1.0)
        ActionChains(chromium).key_up("d").perform()
        released = len(steps)
        time.sleep(0.3)
    finally:
        edge.stop()
        if loop.is_alive():
            loop.join(10)
        edge.close()
        context.term()
    assert all(s.actor == pb.ACTOR_HUMAN for s in steps)
    return steps[:pressed], steps[pressed:released], edge.safety.max_delta


def check_take_over(idle: list[Step], keyed: list[Step], limit: np.ndarray) -> str:
    """What a person relies on: no joint moves more than the limit a step; nothing held keeps the pose."""
    assert len(idle) >= 0.5 * 2.0 * HZ and len(keyed) >= 0.5 * 1.0 * HZ, (len(idle), len(keyed))
    moved = np.array([s.after - s.before for s in idle + keyed])
    assert (np.abs(moved) <= limit + 1e-3).all(), np.abs(moved).max(axis=0)  # never more than the limit a step
    np.testing.assert_allclose(idle[0].before, list(START.values()), atol=1e-3)  # taken over at START
    for s in idle:  # nothing held: the goal is the current pose, and the arm stays
        np.testing.assert_allclose(s.goal, s.before, atol=1e-3)
        np.testing.assert_allclose(s.after, list(START.values()), atol=1e-3)
    key = np.array([s.after - s.before for s in keyed])
    assert (np.abs(key[:, 1:]) < 1e-3).all()  # only the held key's joint moves, and forwards
    assert (key[:, 0] > -1e-3).all() and key[:, 0].sum() >= 0.25 * len(keyed) * limit[0]
    return (
        f"{len(idle)} steps with nothing held, {len(keyed)} with D held, at {HZ:g} Hz (limit {limit[0]:.3f} "
        f"deg/step): largest joint move {np.abs(moved).max():.3f} deg; j1 moved {key[:, 0].sum():.2f} deg; "
        f"goal - pose while idle {max(np.abs(s.goal - s.before).max() for s in idle):.3g} deg"
    )


def test_a_take_over_holds_the_pose_and_a_held_key_moves_by_at_most_the_step_limit(chromium) -> None:
    robot = LeRobotRobot(
        ServoArm(), robot_id="arm-0", control_hz=HZ, episode_steps=100_000, reset="pose", reset_pose=START, reset_s=0.0
    )
    idle, keyed, limit = take_over(robot, chromium)
    declared = (RANGE[1] - RANGE[0]) * 360 / 4095 / (FULL_RANGE_S * HZ)  # the calibrated range in 2 s: 3 deg/step
    np.testing.assert_allclose(limit, [declared] * 3, rtol=1e-6)
    print("\n" + check_take_over(idle, keyed, limit))
