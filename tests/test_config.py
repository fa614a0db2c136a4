"""Typed config: YAML + dotted overrides; every mistake is one line that names the key and
says what is allowed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from user_rl.config import Config, ConfigError, build_config, dump_config, load_config

YAML = """\
name: reach-test
seed: 3
robot:
  type: mujoco_reach
  options:
    episode_steps: 40
fleet:
  num_robots: 4
  batch_transitions: 32
policy:
  hidden: [128, 128]
algo:
  gamma: 0.98
learner:
  device: cpu
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "reach.yaml"
    path.write_text(YAML)
    return path


def error(data: dict | None = None, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        build_config(data or {}, overrides)
    message = str(info.value)
    assert "\n" not in message, f"error spans several lines: {message!r}"
    assert message.startswith("config error")
    return message


def test_load_yaml(config_file: Path) -> None:
    cfg = load_config(config_file)
    assert isinstance(cfg, Config)
    assert cfg.name == "reach-test" and cfg.seed == 3
    assert cfg.robot.type == "mujoco_reach" and cfg.robot.options == {"episode_steps": 40}
    assert cfg.fleet.num_robots == 4 and cfg.fleet.batch_transitions == 32
    assert cfg.policy.hidden == [128, 128]
    assert cfg.algo.gamma == 0.98
    assert cfg.learner.device == "cpu"
    # Unset keys keep their defaults.
    assert cfg.algo.tau == Config().algo.tau
    assert cfg.fleet.heartbeat_s == Config().fleet.heartbeat_s


def test_overrides_win_over_the_file(config_file: Path) -> None:
    cfg = load_config(
        config_file,
        [
            "fleet.num_robots=2",
            "policy.hidden=[64,64]",
            "algo.actor_lr=1e-3",
            "robot.options.obs_mode=image",
            "stop.success_rate=0.9",
        ],
    )
    assert cfg.fleet.num_robots == 2
    assert cfg.policy.hidden == [64, 64]
    assert cfg.algo.actor_lr == pytest.approx(1e-3)
    assert cfg.robot.options == {"episode_steps": 40, "obs_mode": "image"}  # merged, not replaced
    assert cfg.stop.success_rate == 0.9
    assert cfg.fleet.batch_transitions == 32  # siblings in the file are kept
    assert cfg.robot_options(1) == {
        "episode_steps": 40,
        "obs_mode": "image",
        "robot_id": "mujoco_reach-1",
        "seed": 1003,
    }


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == Config()


def test_dumped_config_loads_back(config_file: Path, tmp_path: Path) -> None:
    cfg = load_config(config_file, ["fleet.num_robots=2"])
    again = tmp_path / "again.yaml"
    again.write_text(dump_config(cfg))
    assert load_config(again) == cfg


def test_unknown_top_level_key() -> None:
    message = error({"fleets": {"num_robots": 2}})
    assert "'fleets'" in message
    for allowed in ("robot", "fleet", "policy", "algo", "learner", "stop"):
        assert allowed in message
    message = error(overrides=["bogus=1"])
    assert "'bogus'" in message and "fleet" in message


def test_unknown_nested_key_names_it_and_the_allowed_keys(config_file: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(config_file, ["fleet.num_robot=3"])
    message = str(info.value)
    assert "\n" not in message
    assert "fleet.num_robot" in message
    assert "num_robots" in message and "batch_transitions" in message
    message = error({"learner": {"gpu": True}})
    assert "learner.gpu" in message and "device" in message and "checkpoint_every_s" in message


@pytest.mark.parametrize(
    ("override", "key", "hint"),
    [
        ("fleet.num_robots=abc", "fleet.num_robots", "integer"),
        ("fleet.num_robots=-1", "fleet.num_robots", "greater than or equal to 0"),
        ("fleet.num_robots=1000", "fleet.num_robots", "256"),
        ("learner.device=tpu", "learner.device", "'cuda'"),
        ("algo.gamma=1.5", "algo.gamma", "1"),
        ("policy.hidden=64", "policy.hidden", "list"),
        ("learner.weight_dtype=int8", "learner.weight_dtype", "bfloat16"),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(override: str, key: str, hint: str) -> None:
    message = error(overrides=[override])
    assert key in message
    assert hint in message
    assert override.split("=", 1)[1] in message  # and what was given


def test_unknown_robot_type_lists_the_known_ones() -> None:
    message = error(overrides=["robot.type=ur5e"])
    assert "'ur5e'" in message
    assert "mujoco_reach" in message and "gym" in message


def test_unknown_robot_option_lists_the_allowed_ones() -> None:
    message = error({"robot": {"type": "mujoco_reach"}}, ["robot.options.bogus=1"])
    assert "'bogus'" in message
    for option in ("obs_mode", "image_size", "episode_steps"):
        assert option in message
    # Per-robot options the fleet sets itself are not the user's to set.
    assert "robot_id" not in message.split("allowed", 1)[1]
    assert "'robot_id'" in error(overrides=["robot.options.robot_id=x"])
    # The allowed options follow the driver.
    message = error({"robot": {"type": "gym", "options": {"obs_mode": "image"}}})
    assert "'obs_mode'" in message and "env_id" in message


def test_an_offline_run_needs_something_to_learn_from_and_an_end() -> None:
    """`fleet.num_robots: 0`: the learner alone, on attached buffers, until stop.max_updates."""
    attach = "buffer.attach=[{path: runs/demos/buffer, source: demo}]"
    assert "name what it trains on in buffer.attach" in error(overrides=["fleet.num_robots=0", "stop.max_updates=9"])
    assert "set stop.max_updates" in error(overrides=["fleet.num_robots=0", attach])
    goal = error(overrides=["fleet.num_robots=0", attach, "stop.max_updates=9", "stop.success_rate=0.9"])
    assert "no robot to check a goal on" in goal
    cfg = build_config({}, ["fleet.num_robots=0", attach, "stop.max_updates=9"])
    assert cfg.offline and not build_config({}, []).offline


@pytest.mark.parametrize("override", ["fleet.num_robots", "=3", "fleet"])
def test_override_without_key_value_is_rejected(override: str) -> None:
    message = error(overrides=[override])
    assert repr(override) in message and "key=value" in message


def test_override_into_a_value_is_rejected() -> None:
    message = error({"name": "x"}, ["name.first=1"])
    assert "name" in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml")
    assert "nope.yaml" in str(info.value) and "\n" not in str(info.value)


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("fleet:\n  num_robots: [1, 2\nalgo: {\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "broken.yaml" in message and "YAML" in message and "\n" not in message


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "mapping" in str(info.value)


def test_config_error_is_a_value_error() -> None:
    # Callers that catch ValueError (e.g. the CLI's one-line error path) see config mistakes too.
    assert issubclass(ConfigError, ValueError)


def test_chunk_policies_and_their_algorithms_are_checked_together() -> None:
    """policy.type flow trains with bc or qc; qc needs a critic to choose among samples; the buffer samples
    as many future actions as the policy's chunk (and qc backs up over as many rewards)."""
    cfg = build_config({}, ["policy.type=flow", "policy.chunk=5", "policy.best_of=8", "algo.type=qc"])
    assert cfg.action_horizon == 5 and cfg.n_step == 5
    assert (cfg.run_buffer().action_horizon, cfg.run_buffer().n_step) == (5, 5)  # what the learner's buffer gets
    assert (cfg.buffer.action_horizon, cfg.buffer.n_step) == (1, 1)  # computed, not written into the config
    assert cfg.policy.options() == {"hidden": [256, 256], "chunk": 5, "flow_steps": 10, "best_of": 8}
    assert build_config({}, ["policy.type=flow", "policy.chunk=5", "algo.type=bc"]).n_step == 1
    for overrides, message in (
        (
            ["policy.type=flow", "algo.type=sac"],
            "policy.type flow trains with algo.type bc, qc, dsrl, residual or flow_ql, not sac",
        ),
        (["algo.type=dsrl"], "policy.type mlp trains with algo.type sac, drq or bc, not dsrl"),
        (["policy.type=flow", "algo.type=qc"], "it needs policy.type flow or vla with policy.best_of of 2 or more"),
        (
            ["policy.chunk=4"],
            "policy.chunk is a setting of policy.type flow, vla or lerobot; this policy's type is mlp",
        ),
        (
            ["policy.type=flow", "policy.chunk=4", "algo.type=bc", "buffer.action_horizon=3"],
            "buffer.action_horizon: this run's policy.chunk is 4; leave buffer.action_horizon out",
        ),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            build_config({}, overrides)


@pytest.mark.parametrize(
    ("section", "kind", "builtins", "group"),
    [
        ("policy", "policy", "mlp, flow, vla, lerobot", "user_rl.policies"),
        ("algo", "algorithm", "sac, drq, bc, qc, dsrl, residual, flow_ql", "user_rl.algos"),
        ("reward", "reward", "env, labels, classifier", "user_rl.rewards"),
    ],
)
def test_a_policy_algo_or_reward_that_is_not_installed_lists_the_known_ones(
    section: str, kind: str, builtins: str, group: str
) -> None:
    """A config may name a plugin's part (docs/guides/add-a-*.md); one no installed package declares is refused."""
    message = error(overrides=[f"{section}.type=residual_thing"])
    assert message.startswith(f"config error: {section}.type: unknown {kind}; known: {builtins}")  # plugins after these
    assert f"entry-point group {group!r}" in message and message.endswith("(got 'residual_thing')")


def test_each_section_is_the_settings_class_its_type_registers() -> None:
    """The registries hold each type's settings class (next to its code); the config validates against it."""
    from user_rl.algos import ALGOS, algo_settings
    from user_rl.policies import ACTORS, policy_settings
    from user_rl.rewards import REWARDS, reward_settings

    lookup = {"policy": policy_settings, "algo": algo_settings, "reward": reward_settings}
    bc, chunks = {"algo": {"type": "bc"}}, {"policy": {"type": "flow", "best_of": 2}}
    for section, registry, extra in (
        ("policy", ACTORS, {"lerobot": {"lerobot": {"type": "act"}}}),
        ("algo", ALGOS, {}),
        ("reward", REWARDS, {"classifier": {"classifier": "clf.pt"}}),
    ):
        for name in registry:
            cfg = build_config(
                {
                    **bc,
                    **(chunks if name in ("qc", "dsrl", "residual", "flow_ql") else {}),
                    section: {"type": name, **extra.get(name, {})},
                }
            )
            assert type(getattr(cfg, section)) is lookup[section](name), (section, name)


def test_algo_options_are_older_configs_nesting_of_an_algorithms_own_keys() -> None:
    """`algo.options` (older plugin configs) holds keys of algo itself: each is checked like one."""
    message = error(overrides=["algo.options.num_critic=5"])
    assert message.startswith("config error: algo.num_critic is not a key of algo.type sac; allowed: type, gamma,")
    assert build_config({}, ["algo.options.tau=0.01"]).algo.tau == 0.01
