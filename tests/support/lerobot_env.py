"""The Python environment the LeRobot tests run in, built with the README's LeRobot command
(`user_rl.extras.LEROBOT_ENV_COMMAND`): LeRobot 0.4.x pins torch below 2.11, the rest of the suite
runs on torch 2.13, so `user-rl[all,smolvla,hil]` (LeRobot, its torch, torchvision and numpy,
transformers for SmolVLA, gym-hil with the MuJoCo below 3.9 it pins, and Ray and the rest) goes into
a venv of its own, as a user's does: `.venv-lerobot/bin/user-rl train` runs a LeRobot robot or
policy, or gym-hil's Panda, there. The tests add their own tools (pytest, selenium) to it.

It is built once per checkout and reused while the requirement it was built for (the extras and what
pyproject.toml lists in them) is unchanged; when that changes, pip installs the new requirement into
the venv there is (mostly nothing to download). A venv of the older kind (one that saw the main
environment's packages) is built again. The test session starts the build in the background as soon
as it knows LeRobot tests will run (it is mostly a download), so the suite does not wait for it
(tests/conftest.py).

    python -m tests.support.lerobot_env      # in the checkout's root: build it now; prints the venv's python

`USER_RL_LEROBOT_PYTHON=/path/to/venv/bin/python` runs the LeRobot tests with an environment built
elsewhere (another checkout's, with this checkout first on its PYTHONPATH) and builds nothing.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

from user_rl.extras import LEROBOT_ENV_COMMAND

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-lerobot"
BUILT = VENV / "built-for"  # the requirement the venv was built for
LOG = VENV.with_name(".venv-lerobot.log")
EXTRAS = tuple(re.search(r"\[([^]]+)\]", LEROBOT_ENV_COMMAND).group(1).split(","))  # the README's command's
INSTALL = f"{REPO}[{','.join(EXTRAS)}]"
TEST_TOOLS = ["pytest>=8", "selenium>=4.20"]  # what the scripts the tests run there import besides user-rl


def requirement() -> str:
    """What the venv is built for: `pip install -e INSTALL`, with the extras' requirements as listed now."""
    text = (REPO / "pyproject.toml").read_text()
    if tomllib is None:
        return f"-e {INSTALL}\n{text}"
    listed = tomllib.loads(text)["project"]["optional-dependencies"]
    return "\n".join([f"-e {INSTALL}", *TEST_TOOLS, *(r for extra in EXTRAS for r in listed[extra])])


def python() -> Path:
    return VENV / "bin" / "python"


def given() -> Path | None:
    """An environment built elsewhere that the developer named (`USER_RL_LEROBOT_PYTHON`), if any."""
    named = os.environ.get("USER_RL_LEROBOT_PYTHON")
    return Path(named) if named else None


def sees_system_packages() -> bool:
    """Whether the venv there is was made to see the main environment's packages (as it once was)."""
    config = VENV / "pyvenv.cfg"
    return config.is_file() and "include-system-site-packages = true" in config.read_text()


def ready() -> bool:
    return BUILT.is_file() and BUILT.read_text() == requirement() and python().is_file()


def build() -> Path:
    """Build the venv unless it is ready (one builder at a time); return its python."""
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.with_name(".venv-lerobot.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready():
            return python()
        started = time.monotonic()
        steps = [[str(python()), "-m", "pip", "install", "-q", "-e", INSTALL, *TEST_TOOLS]]
        if not python().is_file() or sees_system_packages():  # else pip brings the venv there is up to date
            steps.insert(0, [sys.executable, "-m", "venv", "--clear", str(VENV)])
        with LOG.open("w") as log:
            for step in steps:
                log.write(f"$ {' '.join(step)}\n")
                log.flush()
                done = subprocess.run(step, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
                if done.returncode:
                    raise RuntimeError(f"building the LeRobot environment failed at `{' '.join(step)}`: see {LOG}")
            log.write(f"built in {time.monotonic() - started:.0f} s\n")
        BUILT.write_text(requirement())
    return python()


_background: list[subprocess.Popen] = []


def start_in_background() -> None:
    """Start `build()` in a low-priority process unless the venv is ready; `wait` waits for it."""
    if given() is None and not ready() and not _background:
        _background.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.support.lerobot_env"],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=lambda: os.nice(19),
            )
        )


def wait(timeout_s: float = 1200.0) -> Path:
    """The venv's python once the build is done (building it here if nobody started one)."""
    if given() is not None:
        return given()
    for builder in _background:
        builder.wait(timeout_s)
    if not ready():
        build()  # raises with the log's path if it fails (a background build that failed is retried once)
    return python()


if __name__ == "__main__":
    print(build())
