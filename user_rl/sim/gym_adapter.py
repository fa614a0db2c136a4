"""Any gymnasium env with a Box action space, behind the HAL robot interface.

This lets the whole pipeline (edge daemon, wire, learner) run on standard benchmarks such as
InvertedPendulum-v5 or Reacher-v5, which are the quickest sanity checks for a new algorithm.
Observations become dicts of arrays (a Box observation is the "state" key), floats are float32,
and termination vs. truncation is passed through unchanged because bootstrapping depends on it.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # before gymnasium's MuJoCo envs import mujoco

from typing import Any  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from user_rl.hal.action import ActionMode  # noqa: E402
from user_rl.hal.descriptor import DeviceDescriptor  # noqa: E402
from user_rl.hal.robot import Observation, Robot, StepResult  # noqa: E402

# Instructions for the envs people actually use; anything else gets "solve <env id>".
_INSTRUCTIONS = {
    "InvertedPendulum": "balance the pole",
    "InvertedDoublePendulum": "balance the double pole",
    "Reacher": "move the fingertip to the target",
    "Pusher": "push the object to the goal",
    "Pendulum": "swing the pendulum up and keep it upright",
    "MountainCarContinuous": "drive the car up the hill",
    "HalfCheetah": "run forward",
    "Hopper": "hop forward",
    "Walker2d": "walk forward",
    "Ant": "walk forward",
    "Humanoid": "walk forward",
    "Swimmer": "swim forward",
}


def instruction_for(env_id: str) -> str:
    name = env_id.split("/")[-1].split("-")[0]
    return _INSTRUCTIONS.get(name, f"solve {env_id}")


def _float32_box(space: gym.spaces.Box) -> gym.spaces.Box:
    """The same box with float32 bounds (the learner and wire use float32 throughout)."""
    with np.errstate(over="ignore"):  # float64 bounds beyond float32 range become +-inf
        low, high = space.low.astype(np.float32), space.high.astype(np.float32)
    return gym.spaces.Box(low, high, space.shape, np.float32)


def _obs_box(key: str, space: gym.spaces.Space, env_id: str) -> gym.spaces.Box:
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"{env_id}: observation {key!r} is {space}; only Box observations are supported")
    return _float32_box(space) if np.issubdtype(space.dtype, np.floating) else space


def _scalar_info(info: dict[str, Any]) -> dict[str, Any]:
    """Keep plain scalars only: info travels with transitions, arrays and objects do not belong."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, (bool, np.bool_)):
            out[key] = bool(value)
        elif isinstance(value, (int, float, str, np.integer, np.floating)):
            out[key] = value.item() if isinstance(value, np.generic) else value
    return out


class GymRobot(Robot):
    """A gymnasium env as a sim robot: dict observations, float32 Box actions, clipped and echoed."""

    device_kind = "sim"
    action_mode = ActionMode.EFFORT  # Gymnasium's control tasks take forces / torques: zero pushes nothing

    def __init__(
        self,
        *,
        env_id: str,
        robot_id: str = "gym-0",
        control_hz: float = 0.0,
        seed: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> None:
        try:
            self.env = gym.make(env_id, **(env_kwargs or {}))
        except gym.error.Error as exc:  # NameNotFound, VersionNotFound, DeprecatedEnv, ...
            raise ValueError(f"unknown or unavailable gymnasium env id {env_id!r}: {exc}") from exc
        if not isinstance(self.env.action_space, gym.spaces.Box):
            space = self.env.action_space
            self.env.close()
            raise ValueError(f"gym env {env_id!r} has action space {space}; only Box action spaces are supported")
        self.env_id = env_id
        self._seed = seed
        self._closed = False
        self._needs_reset = True

        self._env_action_dtype = self.env.action_space.dtype
        self.action_space = _float32_box(self.env.action_space)
        self.action_space.seed(seed)
        raw = self.env.observation_space
        self._dict_obs = isinstance(raw, gym.spaces.Dict)
        if self._dict_obs:
            spaces = {k: _obs_box(k, s, env_id) for k, s in raw.spaces.items()}
        else:
            spaces = {"state": _obs_box("state", raw, env_id)}
        self.observation_space = gym.spaces.Dict(spaces)

        if control_hz <= 0:
            control_hz = float(self.env.metadata.get("render_fps") or 0.0)
        self.descriptor = DeviceDescriptor(
            kind="sim",
            model=f"gym:{env_id}",
            id=robot_id,
            control_hz=control_hz,
            instruction=instruction_for(env_id),
        )

    def reset(self, seed: int | None = None) -> Observation:
        """The constructor's seed seeds the first episode; later resets continue its generator."""
        self._check_open()
        if seed is None and self._seed is not None:
            seed, self._seed = self._seed, None
        obs, _ = self.env.reset(seed=seed)
        self._needs_reset = False
        return self._observation(obs)

    def step(self, action: np.ndarray) -> StepResult:
        self._check_open()
        if self._needs_reset:
            raise RuntimeError("call reset() before step() (and after an episode ends)")
        space = self.action_space
        applied = np.asarray(action, dtype=np.float32).reshape(space.shape)
        applied = np.clip(np.nan_to_num(applied, nan=0.0), space.low, space.high)
        obs, reward, terminated, truncated, info = self.env.step(applied.astype(self._env_action_dtype))
        self._needs_reset = bool(terminated or truncated)
        return StepResult(
            observation=self._observation(obs),
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            action_applied=applied,
            info=_scalar_info(info),
        )

    def close(self) -> None:
        """Close the env once; safe to call twice."""
        if not self._closed:
            self._closed = True
            self.env.close()

    def _observation(self, obs: Any) -> Observation:
        items = obs.items() if self._dict_obs else (("state", obs),)
        out: Observation = {}
        for key, value in items:
            dtype = self.observation_space[key].dtype
            out[key] = np.asarray(value, dtype=dtype)
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"robot {self.descriptor.id!r} is closed")
