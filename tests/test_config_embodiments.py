"""Heterogeneous fleets in the config: each embodiment becomes a one-model config of its own
(robots, ids, seeds, policy), and the ways to get it wrong are refused with the key named."""

from __future__ import annotations

import pytest

from user_rl.config import Config, ConfigError, build_config, load_config
from user_rl.launch.placement import launch_demands, local_resources

MIXED = {
    "name": "mixed",
    "seed": 5,
    "embodiments": {
        "arm3": {"robot": {"type": "mujoco_reach", "options": {"arm": "3dof"}}, "num_robots": 2},
        "arm4": {
            "robot": {"type": "mujoco_reach", "options": {"arm": "4dof"}},
            "num_robots": 1,
            "policy": {"hidden": [64]},
        },
    },
    "policy": {"hidden": [128, 128]},
}


def error(overrides: list[str], data: dict | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        build_config(data or MIXED, overrides)
    return str(info.value)


def test_each_embodiment_is_a_one_model_config_with_its_own_ids_seeds_and_policy() -> None:
    cfg = build_config(MIXED)
    assert cfg.fleet.num_robots == 3
    arm3, arm4 = cfg.embodiment_configs().values()
    assert (arm3.name, arm3.robot.options, arm3.fleet.num_robots, arm3.policy.hidden) == (
        "mixed-arm3",
        {"arm": "3dof"},
        2,
        [128, 128],
    )
    assert (arm4.name, arm4.robot.options, arm4.fleet.num_robots, arm4.policy.hidden) == (
        "mixed-arm4",
        {"arm": "4dof"},
        1,
        [64],
    )
    robots = [c.robot_options(i) for c in (arm3, arm4) for i in range(c.fleet.num_robots)]
    assert [r["robot_id"] for r in robots] == ["arm3-0", "arm3-1", "arm4-0"]
    assert len({r["seed"] for r in robots}) == 3, "every robot of the run draws its own episodes"
    assert not arm3.embodiments and arm3.embodiment_configs() == {"": arm3}


def test_a_plain_config_is_its_own_only_embodiment() -> None:
    cfg = build_config({"fleet": {"num_robots": 2}})
    assert cfg.embodiment_configs() == {"": cfg}
    assert cfg.embodiment(None) is cfg
    assert cfg.robot_options(1)["robot_id"] == "mujoco_reach-1"


def test_the_config_round_trips_through_its_dump(tmp_path) -> None:
    from user_rl.config import dump_config

    cfg = build_config(MIXED)
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg
    assert Config.model_validate(cfg.model_dump()) == cfg


def test_mistakes_are_refused_with_the_key_named() -> None:
    assert "move this section to embodiments.<name>.robot" in error(["robot.options={arm: 4dof}"])
    assert "the embodiments have 3 robots, not 4" in error(["fleet.num_robots=4"])
    assert "fixed ports would clash" in error(["learner.data_port=5555"])
    assert "embodiments: name 'Left Arm' must be lower-case" in error(
        [], {"embodiments": {"Left Arm": {"robot": {"type": "mujoco_reach"}}}}
    )
    assert "unknown option 'dof'" in error(["embodiments.arm4.robot.options.dof=4"])


def test_an_edge_must_say_which_embodiment_it_is() -> None:
    cfg = build_config(MIXED)
    assert cfg.embodiment("arm4").robot.options == {"arm": "4dof"}
    with pytest.raises(ConfigError, match="say which with --embodiment; this config has: arm3, arm4"):
        cfg.embodiment(None)
    with pytest.raises(ConfigError, match="this config has one robot model"):
        build_config({}).embodiment("arm3")


def test_a_mixed_launch_asks_for_a_learner_and_edges_per_embodiment() -> None:
    cfg = build_config(MIXED)
    assert [d.what for d in launch_demands(cfg)] == [
        "learner arm3",
        "edge arm3-0",
        "edge arm3-1",
        "learner arm4",
        "edge arm4-0",
    ]
    assert local_resources(cfg)["sim:mujoco_reach"] >= 3.0
