"""Running code in the LeRobot tests' environment (tests/support/lerobot_env.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support import lerobot_env


def run_in_lerobot(
    python: Path, *args: str, timeout: float = 600, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """Run `python args...` in the LeRobot environment; unless told not to `check`, fail the test
    with its output if it fails."""
    done = subprocess.run(
        [str(python), *args], capture_output=True, text=True, timeout=timeout, cwd=lerobot_env.REPO, env=env
    )
    assert not check or done.returncode == 0, f"{' '.join(args)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def user_rl_in_lerobot(python: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`user-rl args` run in the LeRobot environment."""
    return run_in_lerobot(python, "-m", "user_rl.cli", *args, check=check)


PLUGINS = Path(__file__).parent / "plugins"


def install_plugins(site: Path) -> dict[str, str]:
    """Put the test's LeRobot plugins on a path with their dist-info, as `pip install` would, and
    return the environment that finds them (and keeps LeRobot's calibration files under `site`)."""
    for package in sorted(PLUGINS.glob("lerobot_*")):
        shutil.copytree(package, site / package.name, ignore=shutil.ignore_patterns("__pycache__"))
        info = site / f"{package.name}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package.name}\nVersion: 0.1\n")
    return {
        **os.environ,
        "PYTHONPATH": str(site),
        "HF_LEROBOT_CALIBRATION": str(site / "calibration"),
        "HF_LEROBOT_HOME": str(site / "lerobot-home"),
    }
