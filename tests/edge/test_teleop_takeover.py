"""A take-over never moves the arm by itself (issue 29.1): a LeRobot arm, whose actions are absolute
`<motor>.pos` goals, taken over from the real teleop page in headless Chromium. Nothing held keeps
the current pose; a held key moves from it by at most the declared per-step limit.

The arm is `LeRobotRobot` (the real HAL driver of LeRobot robots) around `ServoArm`, a stand-in for
the `sim_arm` plugin of tests/lerobot/plugins with the same calibrated STS3215 bus, built without
LeRobot itself (which lives in a venv of its own, tests/lerobot/conftest.py). Its servos reach any
goal in one command, so every goal the edge sends shows as joint motion at once."""

from __future__ import annotations

import threading
import time
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
from user_rl.interop.lerobot_robot import LeRobotRobot
from user_rl.policies import make_actor
from user_rl.robots.safety import FULL_RANGE_S, SafetySettings
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
HZ = 30.0
START = {"j1.pos": 30.0, "j2.pos": -45.0, "j3.pos": 60.0}  # degrees: far from zero
RANGE = (1024, 3072)  # raw servo steps of the calibrated range: +-90 degrees about the middle


class ServoArm:
    """Three position-controlled joints in degrees behind a calibrated Feetech bus, as LeRobot
    presents an SO arm; it logs (pose before, goal, pose after) for every command."""

    name = "servo_arm"

    def __init__(self) -> None:
        self.motors = ["j1", "j2", "j3"]
        degrees = SimpleNamespace(value="degrees")  # lerobot.motors.MotorNormMode.DEGREES
        motor = lambda i: SimpleNamespace(id=i, model="sts3215", norm_mode=degrees)  # noqa: E731
        self.calibration = {m: SimpleNamespace(range_min=RANGE[0], range_max=RANGE[1]) for m in self.motors}
        self.bus = SimpleNamespace(motors={m: motor(i + 1) for i, m in enumerate(self.motors)},
                                   model_resolution_table={"sts3215": 4096})
        self.id, self.is_connected, self.is_calibrated = "arm", True, True
        self.position = np.zeros(3)
        self.log: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.lock = threading.Lock()

    observation_features = property(lambda self: {f"{m}.pos": float for m in self.motors})
    action_features = property(lambda self: {f"{m}.pos": float for m in self.motors})

    def get_observation(self) -> dict:
        return {f"{m}.pos": float(p) for m, p in zip(self.motors, self.position)}

    def send_action(self, action: dict) -> dict:
        goal = np.clip([action.get(f"{m}.pos", p) for m, p in zip(self.motors, self.position)], -90.0, 90.0)
        with self.lock:
            self.log.append((self.position.copy(), goal.copy(), goal.copy()))
        self.position = goal
        return {f"{m}.pos": float(g) for m, g in zip(self.motors, goal)}

    def disconnect(self) -> None:
        self.is_connected = False


@pytest.fixture
def chromium():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-timer-throttling"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_a_take_over_holds_the_pose_and_a_held_key_moves_by_at_most_the_step_limit(chromium) -> None:
    device = ServoArm()
    robot = LeRobotRobot(device, robot_id="arm-0", control_hz=HZ, episode_steps=100_000, reset="pose",
                         reset_pose=START, reset_s=0.0)
    settings = EdgeSettings(control_hz=HZ, safety=SafetySettings())  # no rate limit configured
    teleop = TeleopConfig(enabled=True, speed=0.5, command_timeout_s=0.5)
    source = make_source(robot, teleop, None, HZ)
    context = zmq.Context()
    actor = make_actor("mlp", robot.observation_space, robot.action_space, hidden=[16])
    edge = EdgeDaemon(robot, actor, "tcp://127.0.0.1:1", "tcp://127.0.0.1:1", settings, context,
                      interventions=InterventionMux([source]))  # no learner: the policy would act randomly
    limit = (RANGE[1] - RANGE[0]) * 360 / 4095 / (FULL_RANGE_S * HZ)  # the declared range in 2 s: 3 deg/step
    assert edge.safety.max_delta == pytest.approx([limit] * 3, rel=1e-6)
    steps: list[tuple[int, int]] = []  # (actor, index of its command in device.log)
    edge.step_watchers.append(lambda record: steps.append((record.actor, len(device.log) - 1)))
    server = start_server(edge, source, teleop)
    loop = threading.Thread(target=edge.run, daemon=True)
    try:
        # The person takes over before the first step (the arm is at START after its reset): every
        # step is theirs, so what the arm does is what the take-over does.
        chromium.get(server.url + "&name=alice")
        wait_until(lambda: chromium.find_element(By.ID, "connection").text == "connected", 30, "the page to connect")
        chromium.find_element(By.ID, "take-over").click()
        wait_until(lambda: source.driver[1] == "alice", 10, "alice to drive")
        wait_until(lambda: chromium.execute_script("return window.teleop.driving"), 10, "the page to drive")
        loop.start()
        wait_until(lambda: steps, 10, "the first step")
        first_human = 0
        time.sleep(2.0)  # nothing held
        pressed = len(steps)
        ActionChains(chromium).key_down("d").perform()  # j1.pos +
        time.sleep(1.0)
        ActionChains(chromium).key_up("d").perform()
        released = len(steps)
        time.sleep(0.5)
    finally:
        edge.stop()
        if loop.is_alive():
            loop.join(10)
        edge.close()
        context.term()

    human = [device.log[i] for a, i in steps[first_human:] if a == pb.ACTOR_HUMAN]
    idle = [device.log[i] for a, i in steps[first_human:pressed] if a == pb.ACTOR_HUMAN]
    keyed = [device.log[i] for a, i in steps[pressed:released] if a == pb.ACTOR_HUMAN]
    assert all(a == pb.ACTOR_HUMAN for a, _ in steps)
    assert len(idle) >= 0.5 * 2.0 * HZ and len(keyed) >= 0.5 * 1.0 * HZ, (len(idle), len(keyed))
    moved = np.array([after - before for before, _, after in human])
    print(f"\n{len(human)} human steps at {HZ:g} Hz (limit {limit:.3f} deg/step): largest joint move "
          f"{np.abs(moved).max():.3f} deg; j1 moved {moved[:, 0].sum():.2f} deg; goal - pose while idle "
          f"{max(np.abs(goal - before).max() for before, goal, _ in idle):.3g} deg")
    assert np.abs(moved).max() <= limit + 1e-3  # no joint ever moved more than the per-step limit
    for before, goal, _ in idle:  # nothing held: the goal is the current pose
        np.testing.assert_allclose(goal, before, atol=1e-3)
    np.testing.assert_allclose(idle[0][0], list(START.values()))  # it was taken over at START: still there
    np.testing.assert_allclose(device.position[1:], list(START.values())[1:])
    key_moves = np.array([after - before for before, _, after in keyed])
    assert (key_moves[:, 1:] == 0).all()  # only the held key's joint moves, and forwards
    assert (key_moves[:, 0] >= 0).all() and key_moves[:, 0].sum() >= 0.5 * len(keyed) * 0.5 * limit
