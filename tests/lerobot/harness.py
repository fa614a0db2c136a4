"""Running code in the LeRobot tests' environment (user_rl/testing/lerobot_env.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from user_rl.testing import lerobot_env


def run_in_lerobot(python: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python args...` in the LeRobot environment; fail the test with its output if it fails."""
    done = subprocess.run([str(python), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=lerobot_env.REPO)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done
