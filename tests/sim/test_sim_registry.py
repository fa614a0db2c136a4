"""The sim drivers are reachable by name through the HAL registry (entry points)."""

from user_rl.hal import make_robot, robot_names
from user_rl.hal.registry import robot_option_names
from user_rl.sim.gym_adapter import GymRobot
from user_rl.sim.reach import ReachRobot


def test_names_registered():
    assert {"mujoco_reach", "gym"} <= set(robot_names())


def test_make_reach():
    with make_robot("mujoco_reach", robot_id="x") as r:
        assert isinstance(r, ReachRobot) and r.descriptor.id == "x"
        assert r.reset()["state"].shape == r.observation_space["state"].shape


def test_make_gym():
    with make_robot("gym", env_id="InvertedPendulum-v5") as r:
        assert isinstance(r, GymRobot) and r.descriptor.model == "gym:InvertedPendulum-v5"
        r.reset(seed=0)


def test_option_names_for_config_validation():
    assert set(robot_option_names("mujoco_reach")) == {
        "robot_id",
        "arm",
        "obs_mode",
        "image_size",
        "extra_cameras",
        "episode_steps",
        "control_hz",
        "seed",
        "reward",
        "camera",
        "targets",
        "success_distance",
        "goal",
    }
    assert set(robot_option_names("gym")) == {"env_id", "robot_id", "control_hz", "seed", "env_kwargs", "success_key"}
