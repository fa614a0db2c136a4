"""Any gymnasium env with a Box action space, behind the HAL robot interface.

This lets the whole pipeline (edge daemon, wire, learner) run on standard benchmarks such as
InvertedPendulum-v5 or Reacher-v5, which are the quickest sanity checks for a new algorithm, and on
third-party robot envs such as gym-hil's MuJoCo Panda (`gym_hil/PandaPickCubeBase-v0`).
Observations become flat dicts of arrays: a Box observation is the "state" key, a Dict's boxes keep
their keys, and nested Dicts are flattened with dots at any depth (gym-hil's
`{"pixels": {"front", "wrist"}}` becomes `pixels.front` and `pixels.wrist`: LeRobot forbids "/" in
feature names, and the buffer's columns are already `obs/<key>`), so the buffer, the exports and the
policies see one key per array. Floats are float32, and termination vs. truncation is passed through
unchanged because bootstrapping depends on it.

An id in a namespace gymnasium does not know yet (`gym_hil/...`, registered by `import gym_hil`) makes
the driver import the module of that name and try again. The env's success flag is
`info[success_key]` (gym-hil's is `succeed`), passed on as `info["is_success"]`, which the edge and
the evaluations count. An env (or a wrapper of it) with `expert_action()` and `distance_to_goal()`
can be driven by the scripted intervener (`intervention.scripted`, user_rl/edge/scripted.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # before gymnasium's MuJoCo envs import mujoco

import importlib  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
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
    "PandaPickCube": "pick up the cube",  # gym-hil
    "PandaPickCubeBase": "pick up the cube",
    "PandaArrangeBoxes": "arrange the boxes",
    "PandaArrangeBoxesBase": "arrange the boxes",
}
SEPARATOR = "."  # joins the keys of nested Dict observations: {"pixels": {"front": ...}} -> "pixels.front"
EXPERT_METHODS = ("expert_action", "distance_to_goal")  # what the scripted intervener calls


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
        raise ValueError(
            f"{env_id}: observation {key!r} is {space}; only Box observations (and Dicts of them) are supported"
        )
    return _float32_box(space) if np.issubdtype(space.dtype, np.floating) else space


def _leaves(space: gym.spaces.Space, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], gym.spaces.Space]]:
    """Every space inside nested Dicts, with the keys that lead to it (depth first, in the Dicts' order)."""
    if isinstance(space, gym.spaces.Dict):
        for key, inner in space.spaces.items():
            yield from _leaves(inner, (*path, str(key)))
    else:
        yield path, space


def flat_observation_space(space: gym.spaces.Space, env_id: str) -> tuple[gym.spaces.Dict, dict[str, tuple[str, ...]]]:
    """The driver's flat Dict of Boxes for an env's observation space, and for each flat key the keys
    that reach its array in the env's (nested) observation. A Box alone is the key "state"."""
    if not isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({"state": _obs_box("state", space, env_id)}), {"state": ()}
    boxes: dict[str, gym.spaces.Box] = {}
    paths: dict[str, tuple[str, ...]] = {}
    for path, inner in _leaves(space):
        key = SEPARATOR.join(path)
        if key in paths:
            raise ValueError(
                f"{env_id}: observations {list(paths[key])} and {list(path)} would both be "
                f"{key!r} once nested Dicts are flattened with {SEPARATOR!r}"
            )
        boxes[key], paths[key] = _obs_box(key, inner, env_id), path
    return gym.spaces.Dict(boxes), paths


def make_env(env_id: str, env_kwargs: dict[str, Any]) -> gym.Env:
    """`gym.make`, and for an id in a namespace gymnasium does not know (`gym_hil/PandaPickCubeBase-v0`
    before `import gym_hil`): import the module the namespace names, as gymnasium itself does for
    `module:id`, and try again. Errors say what to install or how to name the module."""
    try:
        try:
            return gym.make(env_id, **env_kwargs)
        except gym.error.NamespaceNotFound:
            if ":" in env_id:  # gymnasium imported the module the id names: it registers nothing there
                raise
            namespace = gym.envs.registration.parse_env_id(env_id)[0]
            _import_namespace(namespace, env_id)
            try:
                return gym.make(env_id, **env_kwargs)
            except gym.error.NamespaceNotFound as exc:
                raise ValueError(
                    f"gymnasium env {env_id!r}: importing {namespace!r} registered no env in namespace {namespace!r}; "
                    f"if another module registers it, name that module: env_id: 'module:{env_id}'"
                ) from exc
    except gym.error.Error as exc:  # NameNotFound, VersionNotFound, DeprecatedEnv, ...
        raise ValueError(f"unknown or unavailable gymnasium env id {env_id!r}: {exc}") from exc


def _import_namespace(namespace: str, env_id: str) -> None:
    """Import the module an env id's namespace names (its import registers the namespace's envs)."""
    try:
        importlib.import_module(namespace)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (namespace == exc.name or namespace.startswith(exc.name + ".")):
            raise  # the package is there, one of its own dependencies is not (mujoco: the sim extra)
        raise ValueError(
            f"gymnasium env {env_id!r}: no env is registered in namespace {namespace!r} and there is no module "
            f"{namespace!r} to import that would register it: install the package that provides it (pip install "
            f"{namespace.replace('_', '-')}, if that is its name) or, if a module of another name registers it, "
            f"give the id as 'module:{env_id}'"
        ) from None


def _env_method(env: gym.Env, name: str) -> Callable[[], Any] | None:
    """The env's own `name()` (found through its wrappers), if it has one."""
    try:
        found = env.get_wrapper_attr(name)
    except AttributeError:
        return None
    return found if callable(found) else None


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
        success_key: str = "is_success",
    ) -> None:
        """`control_hz` 0: the env's `metadata["render_fps"]`, if it has one. `success_key`: the info
        entry that says the task succeeded (gym-hil: `succeed`), passed on as `info["is_success"]`."""
        self.env = make_env(env_id, env_kwargs or {})
        if not isinstance(self.env.action_space, gym.spaces.Box):
            space = self.env.action_space
            self.env.close()
            raise ValueError(f"gym env {env_id!r} has action space {space}; only Box action spaces are supported")
        self.env_id = env_id
        self.success_key = success_key
        self._seed = seed
        self._closed = False
        self._needs_reset = True

        self._env_action_dtype = self.env.action_space.dtype
        self.action_space = _float32_box(self.env.action_space)
        self.action_space.seed(seed)
        try:
            self.observation_space, self._paths = flat_observation_space(self.env.observation_space, env_id)
        except ValueError:
            self.env.close()
            raise
        for name in EXPERT_METHODS:  # only an env that has them offers them (the scripted intervener checks)
            method = _env_method(self.env, name)
            if method is not None:
                setattr(self, name, method)

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
        info = _scalar_info(info)
        if self.success_key in info:
            info["is_success"] = bool(info[self.success_key])
        return StepResult(
            observation=self._observation(obs),
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            action_applied=applied,
            info=info,
        )

    def close(self) -> None:
        """Close the env once; safe to call twice."""
        if not self._closed:
            self._closed = True
            self.env.close()

    def _observation(self, obs: Any) -> Observation:
        """The env's (nested) observation as the flat dict of `observation_space`."""
        out: Observation = {}
        for key, path in self._paths.items():
            value = obs
            for part in path:
                value = value[part]
            out[key] = np.asarray(value, dtype=self.observation_space[key].dtype)
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"robot {self.descriptor.id!r} is closed")
