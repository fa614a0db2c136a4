"""A robot controller installs `user-rl[edge]` only: no Ray, no MuJoCo. These tests install the
package exactly that way into a fresh virtualenv (no system site packages) and run `user-rl edge`
from it against a learner in this environment, then check that commands needing an extra the
controller lacks say which extra to install.

The venv takes the torch build this environment has (same version string, so a CPU machine's
CPU wheel from its local wheel directory, never a different build from an index), then the
package from a copy of this checkout. About 30-60 s on 2 busy cores; pytest -s prints the time.
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from user_rl.config import build_config
from user_rl.testing.learner import serving_learner
from user_rl.testing.wait import wait_until

REPO = Path(__file__).resolve().parents[1]
NOT_SHIPPED = shutil.ignore_patterns(
    ".git", "__pycache__", "*.egg-info", "build", "runs", ".pytest_cache", ".venv", ".venv-*"
)


def _venv_env() -> dict[str, str]:
    """This environment minus anything that would let the venv import this checkout or our packages."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(cmd: list, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=_venv_env(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def edge_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding torch and `user-rl[edge]`, installed non-editable from a copy of this checkout."""
    root = tmp_path_factory.mktemp("edge-install")
    started = time.monotonic()
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", venv], 120)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "--quiet", f"torch=={torch.__version__}"], 600, cwd=root)
    source = root / "user-rl"
    shutil.copytree(REPO, source, ignore=NOT_SHIPPED)
    _run([python, "-m", "pip", "install", "--quiet", f"{source}[edge]"], 600, cwd=root)
    print(f"\nedge-only venv: created and installed in {time.monotonic() - started:.0f} s")
    return venv


def test_the_package_holds_no_test_infrastructure() -> None:
    """Nothing in the installed package runs pip or builds a venv: the suite's own infrastructure
    (the LeRobot venv, the example driver installed with pip) lives in tests/support/."""
    commands = []
    for path in sorted((REPO / "user_rl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.List, ast.Tuple)):
                words = [e.value for e in node.elts if isinstance(e, ast.Constant)]
                if "pip" in words or "venv" in words:
                    commands.append(f"{path.relative_to(REPO)}:{node.lineno}: {words}")
    assert not commands, commands


def test_an_edge_only_install_has_neither_ray_nor_mujoco(edge_venv: Path, tmp_path: Path) -> None:
    probe = (
        "import importlib.util as u, user_rl; "
        "print(user_rl.__file__); print(sorted(m for m in ('ray', 'mujoco') if u.find_spec(m)))"
    )
    lines = _run([edge_venv / "bin" / "python", "-c", probe], 60, cwd=tmp_path).stdout.splitlines()
    assert Path(lines[0]).is_relative_to(edge_venv), f"user_rl came from {lines[0]}, not the venv"
    assert lines[1] == "[]", f"the edge extra installed {lines[1]}"


def test_the_edge_only_install_streams_to_a_learner_and_takes_its_policy(edge_venv: Path, tmp_path: Path) -> None:
    """`user-rl edge` from the venv drives a gymnasium classic-control robot (no MuJoCo), streams
    every step to a learner in this environment, loads the policy the learner publishes, and
    detaches cleanly on Ctrl-C. Its config also has a MuJoCo embodiment, which the controller
    never runs: the config still validates there."""
    cfg_dict = {
        "embodiments": {
            "pend": {"robot": {"type": "gym", "options": {"env_id": "Pendulum-v1"}}},
            "arm": {"robot": {"type": "mujoco_reach", "options": {"arm": "3dof"}}},
        },
        "fleet": {"pace_to_learner": False, "control_hz": 200, "batch_transitions": 16},
        "policy": {"hidden": [32]},
        "algo": {"learning_starts": 200, "batch_size": 32},
        "learner": {"torch_threads": 1},
    }
    config = tmp_path / "edge.yaml"
    config.write_text(yaml.safe_dump(cfg_dict))
    with serving_learner(build_config(cfg_dict).embodiment("pend"), tmp_path / "run") as learner:
        edge = subprocess.Popen(
            [
                edge_venv / "bin" / "user-rl",
                "edge",
                config,
                "--robot",
                "pendulum-ctl",
                "--embodiment",
                "pend",
                "--learner",
                learner.addresses["data"],
                "--weights",
                learner.addresses["weights"],
                "--spool",
                tmp_path / "spool",
            ],
            cwd=tmp_path,
            env=_venv_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

        def robot() -> dict:
            return learner.status().get("robots", {}).get("pendulum-ctl", {})

        try:
            wait_until(
                lambda: (
                    edge.poll() is not None
                    or (robot().get("transitions", 0) > 300 and robot().get("latest_version", -1) >= 1)
                ),
                240,
                "the venv's edge to stream and take a policy from the learner",
            )
        finally:
            if edge.poll() is None:
                edge.send_signal(signal.SIGINT)
            output, _ = edge.communicate(timeout=120)
        assert edge.returncode == 0, output
        assert "edge pendulum-ctl: detached after" in output and "(0 batches left in the spool)" in output, output
        steps = int(output.split("detached after ")[1].split()[0])
        wait_until(lambda: robot().get("detached") is True, 30, "the learner to see the robot leave")
        print(f"edge-only venv: {steps} steps streamed, policy v{robot()['latest_version']} taken")
        assert robot()["transitions"] == steps == learner.env_steps  # every step arrived, once
        assert robot()["latest_version"] >= 1


NO_LEARNER = ["--learner", "tcp://127.0.0.1:9", "--weights", "tcp://127.0.0.1:9"]
EDGE_NEEDS_SIM = (
    "user-rl edge needs the sim extra (mujoco is not installed here): pip install -e '.[sim]' in the user-rl checkout"
)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["train", "configs/reach.yaml"],
            "user-rl train needs the cluster extra (ray is not installed here): "
            "pip install -e '.[cluster,sim]' in the user-rl checkout",
        ),
        (["edge", "configs/reach.yaml", "--robot", "arm-0", *NO_LEARNER], EDGE_NEEDS_SIM),
        (["edge", "configs/inverted_pendulum.yaml", "--robot", "pole-0", *NO_LEARNER], EDGE_NEEDS_SIM),
    ],
)
def test_a_command_whose_extra_is_missing_names_the_extra_to_install(
    edge_venv: Path, tmp_path: Path, args: list[str], expected: str
) -> None:
    """`mujoco_reach` (our MuJoCo arm) and a gymnasium MuJoCo env both need the sim extra; train needs Ray."""
    spool = ["--spool", str(tmp_path / "spool")] if args[0] == "edge" else []
    done = subprocess.run(
        [edge_venv / "bin" / "user-rl", *args, *spool],
        cwd=REPO,
        env=_venv_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"user-rl: {expected}"
