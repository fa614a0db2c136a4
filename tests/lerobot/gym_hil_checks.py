"""Run in the LeRobot environment by test_lerobot_gym_hil.py: gym-hil's PandaPickCube through the gym
driver by its plain id (the driver imports gym_hil for the id's namespace), with its cameras, picked
up by the scripted expert of gym_hil_tasks/hil_scripted.py; prints what it found as JSON.

    python tests/lerobot/gym_hil_checks.py
"""

import json
import sys
import time
from pathlib import Path

import mujoco
import numpy as np

from user_rl.sim.gym_adapter import GymRobot

found: dict = {"mujoco": mujoco.__version__, "gym_hil_imported_first": "gym_hil" in sys.modules}
robot = GymRobot(
    env_id="gym_hil/PandaPickCubeBase-v0",
    robot_id="panda-0",
    seed=0,
    env_kwargs={"image_obs": True},
    success_key="succeed",
)
found["spaces"] = {k: [list(s.shape), str(s.dtype)] for k, s in robot.observation_space.spaces.items()}
found["action"] = [
    list(robot.action_space.shape),
    float(robot.action_space.low.min()),
    float(robot.action_space.high.max()),
]
found["control_hz"] = robot.descriptor.control_hz
found["instruction"] = robot.instruction

sys.path.insert(0, str(Path(__file__).parent / "gym_hil_tasks"))
from hil_scripted import PickExpert, without_shadows  # noqa: E402  (after the driver imported gym_hil)

without_shadows(robot.env)
expert = PickExpert(robot.env)
obs = robot.reset()
found["reset_keys"] = sorted(obs)
first = {k: v.copy() for k, v in obs.items()}
started, successes, lifted = time.monotonic(), [], 0.0
for step in range(1, 101):  # noqa: B007  (the step count is reported)
    result = robot.step(expert.action())
    expert.observe(result.action_applied)
    successes.append(result.info.get("is_success"))
    lifted = max(lifted, float(expert.base.data.sensor("block_pos").data[2] - expert.base._z_init))
    if result.terminated or result.truncated:
        break
found.update(
    steps=step,
    seconds_per_step=(time.monotonic() - started) / step,
    terminated=result.terminated,
    truncated=result.truncated,
    reward=result.reward,
    info=result.info,
    successes_before_the_last=sum(bool(s) for s in successes[:-1]),
    lifted_m=lifted,
    final_keys=sorted(result.observation),
    final_in_space=bool(result.observation in robot.observation_space),
    cameras_moved={k: bool((first[k] != result.observation[k]).any()) for k in ("pixels.front", "pixels.wrist")},
)
robot.close()

plain = GymRobot(env_id="gym_hil/PandaPickCubeBase-v0", robot_id="panda-1")  # state only, default success_key
plain.reset()
found["state_only_keys"] = sorted(plain.observation_space.spaces)
found["default_info"] = plain.step(np.zeros(7, np.float32)).info
plain.close()
print(json.dumps(found))
