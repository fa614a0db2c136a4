"""Gymnasium envs through the HAL robot interface: spaces, dtypes, termination vs truncation."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from tests.support import nested_gym
from user_rl.sim.gym_adapter import GymRobot


class _DictGoalEnv(gym.Env):
    """A tiny real env with a Dict observation (float64 + image) and an is_success flag."""

    observation_space = gym.spaces.Dict(
        {
            "state": gym.spaces.Box(-1.0, 1.0, (2,), np.float64),
            "image": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
        }
    )
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2)
        return self._obs(), {}

    def step(self, action):
        self.pos = np.clip(self.pos + 0.5 * action, -1, 1)
        dist = float(np.linalg.norm(self.pos))
        return self._obs(), -dist, False, False, {"is_success": np.bool_(dist < 0.1), "arr": np.zeros(3)}

    def _obs(self):
        return {"state": self.pos.copy(), "image": np.full((8, 8, 3), 7, np.uint8)}


gym.register("UserRLDictGoal-v0", entry_point=_DictGoalEnv, max_episode_steps=20)


def test_inverted_pendulum_spaces_and_step():
    r = GymRobot(env_id="InvertedPendulum-v5", seed=0)
    assert r.descriptor.kind == "sim" and r.descriptor.model == "gym:InvertedPendulum-v5"
    assert r.descriptor.control_hz == 25.0  # from the env's render_fps
    assert r.instruction == "balance the pole"
    assert r.action_space.dtype == np.float32 and r.action_space.shape == (1,)
    assert r.observation_space["state"].dtype == np.float32
    obs = r.reset()
    assert obs["state"].dtype == np.float32 and obs["state"].shape == (4,)
    res = r.step(np.array([10.0]))
    assert res.action_applied.dtype == np.float32
    np.testing.assert_array_equal(res.action_applied, [3.0])  # clipped to the env's bounds
    assert res.observation["state"].dtype == np.float32 and isinstance(res.reward, float)
    r.close()
    r.close()


def test_seed_reproduces_first_episode():
    a = GymRobot(env_id="InvertedPendulum-v5", seed=4)
    b = GymRobot(env_id="InvertedPendulum-v5", seed=4)
    np.testing.assert_array_equal(a.reset()["state"], b.reset()["state"])
    assert not np.array_equal(a.reset()["state"], GymRobot(env_id="InvertedPendulum-v5", seed=5).reset()["state"])


def _balance(state: np.ndarray) -> np.ndarray:
    """PD on pole angle and cart: enough to keep the pole up for a short episode."""
    x, theta, v, omega = state
    return np.array([10 * theta + 2 * omega + 0.5 * x + 0.5 * v], np.float32)


def test_time_limit_is_truncation_not_termination():
    r = GymRobot(env_id="InvertedPendulum-v5", seed=1, env_kwargs={"max_episode_steps": 30})
    obs = r.reset()
    results = []
    for _ in range(30):
        res = r.step(_balance(obs["state"]))
        obs = res.observation
        results.append(res)
    assert not any(x.terminated for x in results)
    assert [x.truncated for x in results] == [False] * 29 + [True]


def test_falling_pole_is_termination():
    r = GymRobot(env_id="InvertedPendulum-v5", seed=1)
    r.reset()
    for step in range(200):  # noqa: B007  (step is checked after the loop)
        res = r.step(np.array([3.0], np.float32))
        if res.terminated or res.truncated:
            break
    assert res.terminated and not res.truncated and step < 100
    with pytest.raises(RuntimeError):
        r.step(np.zeros(1, np.float32))  # the episode is over until reset()


def test_reacher():
    r = GymRobot(env_id="Reacher-v5", robot_id="reacher-3", seed=0)
    assert r.descriptor.id == "reacher-3" and r.descriptor.control_hz == 50.0
    assert r.observation_space["state"].shape == (10,) and r.action_space.shape == (2,)
    obs = r.reset()
    assert obs in r.observation_space
    for n in range(1, 51):  # noqa: B007  (n is checked after the loop)
        res = r.step(r.action_space.sample())
        assert res.observation["state"].dtype == np.float32
        assert isinstance(res.info["reward_dist"], float)
        if res.truncated:
            break
    assert n == 50 and not res.terminated  # Reacher-v5's TimeLimit is 50 steps


def test_dict_observation_and_success_pass_through():
    r = GymRobot(env_id="UserRLDictGoal-v0", seed=0, control_hz=10.0)
    assert r.descriptor.control_hz == 10.0 and r.instruction == "solve UserRLDictGoal-v0"
    assert r.observation_space["state"].dtype == np.float32
    assert r.observation_space["image"].dtype == np.uint8
    obs = r.reset()
    assert obs["state"].dtype == np.float32 and obs["image"].dtype == np.uint8
    res = r.step(-obs["state"] * 2)
    assert res.info["is_success"] is True and "arr" not in res.info


def test_unknown_env_id_names_it():
    with pytest.raises(ValueError, match="NoSuchEnv-v9"):
        GymRobot(env_id="NoSuchEnv-v9")


def test_discrete_action_space_rejected():
    with pytest.raises(ValueError, match="CartPole-v1"):
        GymRobot(env_id="CartPole-v1")


def test_nested_dict_observations_are_flattened_with_dots_in_spaces_and_every_observation():
    """gym-hil's Panda observes {"agent_pos", "pixels": {"front", "wrist"}}: one flat key per array,
    at any depth, in the spaces, the reset's observation, every step's and the final one."""
    r = GymRobot(env_id=nested_gym.ENV_ID, seed=0)
    space = r.observation_space
    assert set(space.spaces) == nested_gym.FLAT_KEYS
    assert space["pixels.front"] == gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)
    assert space["agent_pos"].dtype == np.float32 and space["deep.a.b"].shape == (1,)
    assert r.descriptor.control_hz == 10.0  # the env's render_fps
    obs = r.reset()
    assert obs in space and set(obs) == nested_gym.FLAT_KEYS
    assert (obs["pixels.front"] == 0).all() and (obs["pixels.wrist"] == 200).all()
    for n in range(1, nested_gym.MAX_STEPS + 1):
        res = r.step(np.zeros(3, np.float32))  # stays where it is: the time limit ends the episode
        assert res.observation in space
        assert (res.observation["pixels.front"] == n).all() and (res.observation["pixels.wrist"] == 200 - n).all()
        np.testing.assert_allclose(res.observation["deep.a.b"], [n / nested_gym.MAX_STEPS])
        if res.terminated or res.truncated:
            break
    assert res.truncated and n == nested_gym.MAX_STEPS  # the final observation is flat too (checked above)


def test_success_key_names_the_envs_success_flag_and_becomes_is_success():
    r = GymRobot(env_id=nested_gym.ENV_ID, seed=1, success_key="succeed")
    r.reset()
    first = r.step(np.zeros(3, np.float32))
    assert first.info == {"succeed": False, "is_success": False}
    while True:
        res = r.step(r.expert_action())  # the env's expert, offered through the driver
        if res.terminated or res.truncated:
            break
    assert res.terminated and res.info["is_success"] is True and res.info["succeed"] is True
    assert r.distance_to_goal() < 0.2

    plain = GymRobot(env_id=nested_gym.ENV_ID, seed=1)  # default success_key: is_success, which this env lacks
    plain.reset()
    assert "is_success" not in plain.step(np.zeros(3, np.float32)).info
    assert not hasattr(GymRobot(env_id="InvertedPendulum-v5"), "expert_action")  # only an env that has one


def test_colliding_flat_keys_are_refused():
    class Clash(nested_gym.NestedEnv):
        observation_space = gym.spaces.Dict(
            {
                "a.b": gym.spaces.Box(-1.0, 1.0, (1,)),
                "a": gym.spaces.Dict({"b": gym.spaces.Box(-1.0, 1.0, (1,))}),
            }
        )

    gym.register("UserRLClash-v0", entry_point=Clash)
    with pytest.raises(ValueError, match=r"\['a', 'b'\] and \['a.b'\] would both be 'a.b'"):
        GymRobot(env_id="UserRLClash-v0")


def test_an_id_in_an_unknown_namespace_imports_the_module_of_that_name(tmp_path, monkeypatch):
    """`gym_hil/PandaPickCubeBase-v0` is registered by `import gym_hil`: the driver imports it, as
    gymnasium itself does for `gym_hil:gym_hil/PandaPickCubeBase-v0`."""
    package = tmp_path / "user_rl_tiny_ns"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import gymnasium as gym\n"
        "from tests.support.nested_gym import NestedEnv\n"
        "gym.register('user_rl_tiny_ns/Thing-v0', entry_point=NestedEnv, max_episode_steps=5)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(gym.error.NamespaceNotFound):
        gym.make("user_rl_tiny_ns/Thing-v0")  # what users met before
    r = GymRobot(env_id="user_rl_tiny_ns/Thing-v0", seed=0)
    assert set(r.observation_space.spaces) == nested_gym.FLAT_KEYS
    assert r.descriptor.model == "gym:user_rl_tiny_ns/Thing-v0"
    r.close()


def test_an_unknown_namespace_without_a_module_says_what_to_install_and_the_module_form():
    with pytest.raises(ValueError) as refused:
        GymRobot(env_id="user_rl_no_such_pkg/Thing-v0")
    message = str(refused.value)
    assert "\n" not in message
    assert "pip install user-rl-no-such-pkg" in message
    assert "'module:user_rl_no_such_pkg/Thing-v0'" in message


def test_a_namespace_module_that_registers_nothing_there_is_named(tmp_path, monkeypatch):
    (tmp_path / "user_rl_empty_ns.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="importing 'user_rl_empty_ns' registered no env in namespace"):
        GymRobot(env_id="user_rl_empty_ns/Thing-v0")
