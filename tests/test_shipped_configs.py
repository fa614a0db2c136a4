"""Every config this repository ships (configs/, examples/, the YAML blocks of the docs) loads, and
survives being written and read back; each in configs/ builds what it trains from its robot's own
spaces: the actor that acts on a real observation, and the algorithm, which takes an update.

YAML that names a plugin's robot, policy, algorithm or reward loads only where that plugin is
installed: the guide test that installs it runs that YAML (`PLUGIN_YAML` says which)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests.support.batches import algorithm_batch, buffer_batch
from user_rl.algos import make_algo, make_run_actor, metrics_to_floats
from user_rl.config import Config, build_config, dump_config
from user_rl.hal.registry import make_robot

REPO = Path(__file__).resolve().parents[1]
PLUGIN_YAML = {  # shipped YAML that needs a plugin package: the test that installs it and runs the YAML
    "examples/user_rl_point_plugin/point.yaml": "tests/docs/test_docs_plugin_guides.py",
    "docs/guides/add-a-policy.md#0": "tests/docs/test_docs_plugin_guides.py",
    "docs/guides/add-a-reward.md#0": "tests/docs/test_docs_plugin_guides.py",
    "docs/guides/add-a-task.md#1": "tests/docs/test_docs_plugin_guides.py",
    "docs/guides/add-an-algorithm.md#0": "tests/docs/test_docs_plugin_guides.py",
    "examples/user_rl_example_arm/example_arm.yaml": "tests/docs/test_guide_robot_driver.py",
    "docs/guides/add-a-robot-driver.md#0": "tests/docs/test_guide_robot_driver.py",
    "examples/deploy/lab.yaml": "tests/docs/test_guide_deploy.py",
    "docs/guides/deploy.md#0": "tests/docs/test_guide_deploy.py",
}


def shipped_yaml() -> dict[str, str]:
    """Each YAML file under configs/ and examples/, and each ```yaml block of the docs, by where it is."""
    found = {str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / "configs").glob("*.yaml"))}
    found |= {str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / "examples").rglob("*.yaml"))}
    for doc in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)):
            found[f"{doc.relative_to(REPO)}#{i}"] = block
    return found


SHIPPED = shipped_yaml()
CONFIGS = sorted(name for name in SHIPPED if name.startswith("configs/"))


NOT_INSTALLED_CHECK = """
import json, sys, yaml
from user_rl.config import ConfigError, build_config
errors = {}
for name, text in json.load(sys.stdin).items():
    try:
        build_config(yaml.safe_load(text))
    except ConfigError as error:
        errors[name] = str(error)
print(json.dumps(errors))
"""


def test_the_plugin_yaml_is_run_by_the_test_that_installs_its_plugin() -> None:
    """Only YAML that names a plugin's part is left to a guide test: in a fresh interpreter, where no
    guide test has loaded a plugin, each fails on an unknown type, and its guide test names it."""
    assert set(PLUGIN_YAML) <= set(SHIPPED), sorted(set(PLUGIN_YAML) - set(SHIPPED))
    fresh = subprocess.run(
        [sys.executable, "-c", NOT_INSTALLED_CHECK],
        input=json.dumps({name: SHIPPED[name] for name in PLUGIN_YAML}),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert fresh.returncode == 0, fresh.stderr
    errors = json.loads(fresh.stdout)
    for name, test in PLUGIN_YAML.items():
        assert "unknown" in errors.get(name, "loaded without its plugin"), (name, errors.get(name))
        shown_as = name.split("#")[0].removeprefix("docs/guides/")
        assert shown_as in (REPO / test).read_text() or Path(shown_as).name in (REPO / test).read_text(), (name, test)


@pytest.mark.parametrize("name", sorted(set(SHIPPED) - set(PLUGIN_YAML)))
def test_shipped_yaml_loads_and_reads_back_the_same(name: str, tmp_path: Path) -> None:
    data = yaml.safe_load(SHIPPED[name])
    assert isinstance(data, dict) and set(data) <= set(Config.model_fields), sorted(data)
    cfg = build_config(data)
    assert build_config(yaml.safe_load(dump_config(cfg))) == cfg


@pytest.mark.parametrize("name", CONFIGS)
def test_each_config_builds_its_actor_and_trains_its_algorithm(name: str) -> None:
    cfg = build_config(yaml.safe_load(SHIPPED[name]))
    torch.manual_seed(0)
    with make_robot(cfg.robot.type, **{**cfg.robot_options(0), "robot_id": "check"}) as robot:
        obs_space, action_space = robot.observation_space, robot.action_space
        obs = robot.reset(seed=0)
    actor = make_run_actor(cfg.policy, cfg.algo, obs_space, action_space)
    batch_obs = {key: torch.as_tensor(value).unsqueeze(0) for key, value in obs.items()}
    action = actor.act(batch_obs, deterministic=True)[0].numpy()
    assert action.shape == action_space.shape and np.isfinite(action).all()

    algo = make_algo(cfg.algo.type, obs_space, action_space, cfg.policy.type, cfg.policy.options(), cfg.algo)
    assert type(algo.actor) is type(actor)  # what the learner trains is what the edges run
    rng = np.random.default_rng(0)
    sampled = buffer_batch(obs_space, action_space, rng, size=8, chunk=cfg.action_horizon, gamma=cfg.algo.gamma)
    metrics = metrics_to_floats(algo.update(algorithm_batch(sampled, algo.batch_columns)))
    assert algo.updates == 1 and metrics and np.isfinite(list(metrics.values())).all(), metrics
