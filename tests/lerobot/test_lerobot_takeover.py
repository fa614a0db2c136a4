"""The take-over of tests/edge/test_teleop_takeover.py with LeRobot itself: the `sim_arm` plugin
robot (tests/lerobot/plugins), connected and calibrated by LeRobot, behind `LeRobotRobot`, taken
over from the real page in headless Chromium (issue 29.1)."""

from __future__ import annotations

from pathlib import Path

from tests.lerobot.harness import install_plugins, run_in_lerobot

TAKE_OVER = """
import importlib.util, sys
from user_rl.hal.lerobot.robot import LeRobotRobot

# the scenario and its checks, from the file (another `tests` package may come first on the path)
spec = importlib.util.spec_from_file_location("teleop_takeover", "tests/edge/test_teleop_takeover.py")
scenario = sys.modules["teleop_takeover"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scenario)
HZ, START, check_take_over, chromium_driver, take_over = (scenario.HZ, scenario.START, scenario.check_take_over,
                                                          scenario.chromium_driver, scenario.take_over)

# servos fast enough to reach START in the reset's one command (the plugin's default is 10 degrees)
robot = LeRobotRobot({"type": "sim_arm", "id": "arm_t", "max_step_deg": 180.0}, calibrate=True, robot_id="arm-0",
                     control_hz=HZ, episode_steps=100_000, reset="pose", reset_pose=START, reset_s=0.0)
chromium = chromium_driver()
try:
    print(check_take_over(*take_over(robot, chromium)))
finally:
    chromium.quit()
"""


def test_a_take_over_of_the_lerobot_plugin_arm_holds_its_pose_and_moves_by_at_most_the_step_limit(
    lerobot_python: Path, tmp_path: Path
) -> None:
    done = run_in_lerobot(lerobot_python, "-c", TAKE_OVER, timeout=180, env=install_plugins(tmp_path / "site"))
    print(done.stdout.strip().splitlines()[-1])
    assert "goal - pose while idle 0 deg" in done.stdout
