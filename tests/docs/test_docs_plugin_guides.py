"""The four plugin guides (docs/guides/add-a-task.md, add-a-policy.md, add-an-algorithm.md,
add-a-reward.md) stay true: the files they show are the example package's, the package installs
and its config names its parts, and their commands, run as written, train the example's task with
its policy, algorithm and reward in one real run (Ray, edge processes, learner) that learns, and
print what the guides say they print.

The package is installed the way the guides say, with pip, but into a directory of its own on
PYTHONPATH (`--target`), so this environment stays as it was; entry points on PYTHONPATH are seen
by every process of the run (Ray workers, the trainer process, `user-rl eval`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from tests.docs.guide_blocks import REPO, commands, drift, file_blocks, outputs
from tests.support.install import pip_install_copy
from user_rl.config import ConfigError, build_config, load_config

GUIDES = [
    REPO / "docs" / "guides" / name
    for name in ("add-a-task.md", "add-a-policy.md", "add-an-algorithm.md", "add-a-reward.md")
]
PACKAGE = "examples/user_rl_point_plugin"
CONFIG = REPO / PACKAGE / "point.yaml"
# The run's limits if it never reached its goal (it does in about 1,900 env steps); the goal and
# everything else is the guide's config.
TEST_LIMITS = ["stop.max_env_steps=4000", "stop.max_wall_s=240"]
RADIUS = 0.1  # the task's goal radius (task.py)


@pytest.mark.parametrize("guide", GUIDES, ids=lambda path: path.name)
def test_the_guide_shows_the_example_files_as_they_are(guide: Path) -> None:
    assert file_blocks(guide), f"{guide.name} shows no file of the example"
    assert drift(guide) == []


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example package, pip-installed from a copy (pip builds in the source tree) into its own directory."""
    return pip_install_copy(REPO / PACKAGE, tmp_path_factory.mktemp("point-plugin"))


@pytest.fixture
def plugin_here(plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The package importable, and its entry points visible, in this process too."""
    monkeypatch.syspath_prepend(str(plugin_site))
    return plugin_site


def test_the_config_validates_the_plugins_own_settings(plugin_here: Path) -> None:
    """A plugin policy's and algorithm's `Settings` are their config sections, checked like a built-in's."""
    cfg = load_config(CONFIG)
    assert (cfg.policy.type, cfg.algo.type, cfg.reward.type) == ("residual_mlp", "redq", "point_distance")
    assert type(cfg.policy).__name__ == "ResidualSettings" and type(cfg.algo).__name__ == "REDQSettings"
    assert cfg.policy.options() == {"hidden": [64, 64], "residual_scale": 1.0}  # what the actor is built with
    algo = cfg.algo  # what the learner hands REDQ
    assert (algo.num_critics, algo.target_critics, algo.gamma, algo.actor_lr) == (5, 2, 0.95, 0.001)
    # REDQ's Settings are SAC's with its own default of ten critics, and SAC takes the config's ensemble as it is.
    assert build_config({"algo": {"type": "redq", "critic_layer_norm": True}}).algo.critic_layer_norm
    assert build_config({"algo": {"type": "redq"}}).algo.num_critics == 10
    assert load_config(CONFIG, ["algo.type=sac"]).algo.num_critics == 5
    for overrides, message in (
        (["algo.num_critic=3"], "config error: algo.num_critic is not a key of algo.type redq; allowed: type, gamma,"),
        (["algo.num_critics=many"], "config error: algo.num_critics: Input should be a valid integer"),
        (["algo.target_critics=9"], "config error: algo: algo.target_critics: at most num_critics (5), not 9"),
        (
            ["policy.hidden=[64,32]"],
            "config error: policy.hidden: policy.type residual_mlp repeats one width, e.g. [64, 64] (got [64, 32])",
        ),
        (["policy.residual_scale=2"], "config error: policy.residual_scale: Input should be less than or equal to 1"),
        (
            ["policy.type=mlp", "policy.residual_scale=0.5"],
            "config error: policy.residual_scale is a setting of policy.type residual_mlp",
        ),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(CONFIG, overrides)
    # The guides quote these errors as they are.
    guides = (REPO / "docs/guides/add-a-policy.md").read_text() + (REPO / "docs/guides/add-an-algorithm.md").read_text()
    for overrides in (["policy.hidden=[64,32]"], ["policy.residual_scale=2"], ["algo.target_critics=9"]):
        with pytest.raises(ConfigError) as raised:
            load_config(CONFIG, overrides)
        assert f"`{raised.value}`" in " ".join(guides.split()), raised.value
    legacy = {**load_config(CONFIG).public_dump(), "algo": {"type": "redq", "options": {"num_critics": 3}}}
    assert build_config(legacy).algo.num_critics == 3  # older configs nest an algorithm's own keys in options


def test_the_policy_trains_with_builtin_sac_and_the_reward_checks_its_robot(plugin_here: Path) -> None:
    """add-a-policy.md: with `algo.type: sac` the policy's `Critic` is what SAC learns beside it."""
    from user_rl.algos import make_algo, metrics_to_floats
    from user_rl.policies import TwinQCritic
    from user_rl.rewards import make_reward

    obs_space = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (4,), np.float32)})
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    sac = make_algo("sac", obs_space, action_space, "residual_mlp", {"hidden": [32, 32], "residual_scale": 0.5})
    assert type(sac.actor).__name__ == "ResidualActor" and type(sac.critic) is TwinQCritic
    assert sum(isinstance(m, nn.LayerNorm) for m in sac.actor.modules()) == 3  # two blocks and the head
    batch = {
        "obs": {"state": torch.rand(8, 4)},
        "next_obs": {"state": torch.rand(8, 4)},
        "action": torch.rand(8, 2) * 2 - 1,
        "reward": torch.rand(8),
        "terminated": torch.zeros(8),
    }
    assert np.isfinite(list(metrics_to_floats(sac.update(batch)).values())).all()
    with pytest.raises(ValueError, match="reward.type point_distance reads a 'state'"):
        make_reward("point_distance", gym.spaces.Dict({"joints": gym.spaces.Box(-1, 1, (2,), np.float32)}))


def shell(command: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def check_output(command: str, printed: str, shown: str | None) -> None:
    """What a guide's command printed is what the guide shows (numbers that vary run to run by pattern)."""
    if command.startswith("user-rl eval"):
        success, episodes = re.search(r"success (\S+), .* over (\d+) episodes", printed).groups()
        assert float(success) >= 0.9 and int(episodes) == 100, printed  # learned: 90 of 100 fresh episodes
    elif "read_episodes" in command:  # the first episode that reached the goal, in recorded rewards
        rewards = [float(x) for x in re.findall(r"-?\d+\.\d*(?:e-?\d+)?", printed)]
        assert len(rewards) >= 2 and all(r < 0 for r in rewards[:-1]) and 1 - RADIUS < rewards[-1] <= 1, printed
        assert shown is not None and shown.startswith("[-0.") and shown.rstrip().endswith("]")
    else:
        assert shown is not None, f"the guide shows no output for {command}"
        assert printed.strip() == shown.strip()


def assert_rows_recorded_the_plugin_reward(buffer: Path) -> None:
    """Every stored row's reward is the env's (1 on reaching the goal) minus the distance after the step."""
    from user_rl.cloud.buffer.episodes import read_episodes

    rows = 0
    for episode in read_episodes(buffer):
        states = episode.steps["obs/state"]
        if episode.final_obs is not None:
            next_states = np.concatenate([states[1:], episode.final_obs["state"][None]])
        else:  # still open when the run stopped: its last row has no next observation here
            next_states = states[1:]
        env_reward = episode.steps["terminated"][: len(next_states)].astype(np.float32)
        distance = np.linalg.norm(next_states[:, :2] - next_states[:, 2:], axis=1)
        np.testing.assert_allclose(episode.steps["reward"][: len(next_states)], env_reward - distance, atol=1e-5)
        rows += len(next_states)
    assert rows > 500, rows


@pytest.mark.timeout(400)
def test_the_guides_commands_train_the_plugin_parts_together_and_it_learns(plugin_site: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "MUJOCO_GL": "egl",
        "PYTHONPATH": os.pathsep.join(p for p in (str(plugin_site), os.environ.get("PYTHONPATH", "")) if p),
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ["PATH"])),
    }
    assert shutil.which("user-rl", path=env["PATH"]), "user-rl is not installed beside this Python"
    every = [(guide, command) for guide in GUIDES for command in commands(guide)]
    installs = {command for _, command in every if command.startswith("pip install")}
    assert installs == {f"pip install -e {PACKAGE}"}  # done by the fixture, into a directory of its own
    trains = {command for _, command in every if command.startswith("user-rl train")}
    assert trains == {f"user-rl train {PACKAGE}/point.yaml"}, trains

    started = time.monotonic()
    train = shell(" ".join([trains.pop(), f"run_root={tmp_path / 'runs'}", *TEST_LIMITS]), env, timeout=330)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").glob("point-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    print(
        f"\ntrain: {time.monotonic() - started:.0f} s, {summary['learner']['env_steps']} env steps, "
        f"final eval {summary['final_eval']}"
    )
    assert summary["stop_reason"] == "goal_reached", train.stdout[-3000:]
    assert all(robot["transitions"] > 0 for robot in summary["learner"]["robots"].values())
    assert re.search(r"\| return -\d", train.stdout), "the rollouts' returns are in the recorded (shaped) reward"
    assert_rows_recorded_the_plugin_reward(run_dir / "buffer")

    checked = set()
    for guide, command in every:
        if command.startswith(("pip install", "user-rl train")) or command in checked:
            continue
        checked.add(command)
        done = shell(command.replace("RUN", str(run_dir)), env, timeout=120)
        assert done.returncode == 0, f"{guide.name}: {command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        check_output(command, done.stdout, outputs(guide).get(command))
    assert len(checked) == 5  # eval, and one check of each guide's own part
