"""The example robot driver package (examples/user_rl_example_arm) for tests: installed the way a lab
installs its own driver, with pip, but into a directory of its own that goes on PYTHONPATH (this
environment and the checkout stay untouched), and its simulated controller run as a process of its
own, as hardware would be.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from tests.support.install import pip_install_copy

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "examples" / "user_rl_example_arm"
LISTENING = "example arm controller listening on "


@cache
def example_arm_site() -> Path:
    """Install the package once per process (a copy: pip builds in the source tree); return its directory."""
    root = Path(tempfile.mkdtemp(prefix="user-rl-example-arm-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return pip_install_copy(PACKAGE, root)


def example_arm_env() -> dict[str, str]:
    """This environment with the driver package importable (its entry point registered)."""
    path = os.pathsep.join(p for p in (str(example_arm_site()), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "MUJOCO_GL": "egl"}


@contextmanager
def arm_controller(*args: str, listen: str = "127.0.0.1:0") -> Iterator[str]:
    """Run the simulated controller (`--rate-hz 20`, `--hang ARM:N`, ...); yield its HOST:PORT."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "user_rl_example_arm.simulated_controller", "--listen", listen, *args],
        env=example_arm_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        if not line.startswith(LISTENING):
            raise RuntimeError(f"the simulated controller did not start: {line}{proc.stdout.read()}")
        yield line[len(LISTENING) :].split()[0]
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
