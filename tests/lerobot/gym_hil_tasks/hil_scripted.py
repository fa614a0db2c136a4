"""gym-hil's PandaPickCube with an expert that picks the cube up, for test_lerobot_gym_hil.py (run in
the LeRobot environment, where the `hil` extra installs gym-hil).

Importing this module registers `hil_scripted/PandaPickCubeScripted-v0`: gym-hil's own
`gym_hil/PandaPickCubeBase-v0` (the same kwargs, e.g. `image_obs`; `image_size` sets its cameras'
render size) in a wrapper that offers `expert_action()` and `distance_to_goal()`. The gym driver passes
those on, so the scripted intervener can drive it (`intervention.demo_episodes`); whether the cube
was lifted is gym-hil's own `succeed`. The gym driver imports this module for the id's namespace.

The expert (`PickExpert`) reads the sim: it moves gym-hil's mocap target (the action's first three
numbers are its displacement in metres) above the cube, down to it, closes the fingers, and lifts.

Shadows are off (`without_shadows`): gym-hil's two lights cast them into 4096-pixel shadow maps,
which on a machine without a GPU (MuJoCo's EGL on Mesa's llvmpipe) cost 0.5 s of CPU a step for
the two cameras; without them 0.06 s. The cameras see the same scene, unshaded.
"""

from __future__ import annotations

import gym_hil  # noqa: F401  (registers gym_hil/PandaPickCubeBase-v0)
import gymnasium as gym
import mujoco
import numpy as np
from gym_hil import GymRenderingSpec

ENV_ID = "hil_scripted/PandaPickCubeScripted-v0"
STEP_M = 0.03  # the most the expert moves the target in one step (0.1 s)
HOVER_M = 0.1  # above the cube before going down
LIFT_M = 0.2  # above the cube's start (gym-hil's success: more than 0.1)
CLOSE_STEPS = 5  # steps the fingers get to close on the cube before the lift
DOWN_STEPS = 8  # steps the expert waits at the bottom for the hand to arrive (a finger on the table stops it)


class PickExpert:
    """Above the cube, down, close, lift: each action from the sim's state and the steps so far."""

    def __init__(self, env: gym.Env) -> None:
        self.base = env.unwrapped
        self.restart()

    def restart(self) -> None:
        self.closed = 0  # steps the fingers have been told to close
        self.down = 0  # steps spent at the bottom

    def observe(self, action: np.ndarray) -> None:
        """What the robot really did this step (whoever chose it)."""
        self.closed = self.closed + 1 if action[6] > 0 else 0

    def _positions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        data = self.base.data
        return data.sensor("2f85/pinch_pos").data.copy(), data.sensor("block_pos").data.copy(), data.mocap_pos[0].copy()

    def action(self) -> np.ndarray:
        hand, cube, target = self._positions()
        grip = -1.0
        if self.closed:
            grip = 1.0
            goal = target if self.closed < CLOSE_STEPS else np.array([*target[:2], self.base._z_init + LIFT_M])
        elif np.linalg.norm(hand[:2] - cube[:2]) > 0.015 and hand[2] - cube[2] > 0.03:
            goal = np.array([cube[0], cube[1], cube[2] + HOVER_M])  # over the cube first
        else:
            goal = cube  # down to it
            arrived = np.linalg.norm(target - cube) < 1e-4  # the target is at the cube
            self.down = self.down + 1 if arrived else 0
            if arrived and (np.linalg.norm(hand - cube) < 0.01 or self.down >= DOWN_STEPS):
                grip = 1.0
        move = np.clip(goal - target, -STEP_M, STEP_M)
        return np.array([*move, 0.0, 0.0, 0.0, grip], np.float32)

    def distance_to_goal(self) -> float:
        """How far the hand is from the cube, plus how far the cube still is from lifted."""
        hand, cube, _ = self._positions()
        return float(np.linalg.norm(hand - cube) + max(0.0, self.base._z_success - cube[2]))


class ScriptedPick(gym.Wrapper):
    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.expert = PickExpert(env)

    def reset(self, **kwargs):
        self.expert.restart()
        return self.env.reset(**kwargs)

    def step(self, action):
        self.expert.observe(np.asarray(action))
        return self.env.step(action)

    def expert_action(self) -> np.ndarray:
        return self.expert.action()

    def distance_to_goal(self) -> float:
        return self.expert.distance_to_goal()


def without_shadows(env: gym.Env) -> gym.Env:
    env.unwrapped._viewer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
    return env


def make(image_size: int | None = None, **kwargs) -> gym.Env:
    if image_size is not None:
        kwargs["render_spec"] = GymRenderingSpec(height=image_size, width=image_size)
    return ScriptedPick(without_shadows(gym.make("gym_hil/PandaPickCubeBase-v0", **kwargs)))


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=make)
