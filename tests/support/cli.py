"""`user-rl` started from the checkout as a process of its own, for tests that drive the command line
while it runs (tests/e2e/harness.py `run_cli` runs one to its end)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[2]


def user_rl(*args: str) -> list[str]:
    """The command line of `user-rl args`, run with this Python."""
    return [sys.executable, "-m", "user_rl.cli", *args]


def popen_user_rl(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`user-rl args` started in the checkout (MuJoCo on EGL unless `env` says otherwise), its
    stdout and stderr together in one text pipe."""
    return subprocess.Popen(
        user_rl(*args),
        cwd=REPO,
        env=env or {**os.environ, "MUJOCO_GL": "egl"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


class Started(NamedTuple):
    proc: subprocess.Popen
    lines: list[str]  # its output so far, line by line
    reader: threading.Thread  # collects `lines` until the output ends


def start_user_rl(*args: str, env: dict[str, str] | None = None) -> Started:
    """`popen_user_rl(args)`, its output read into `lines` by a thread while it runs."""
    proc = popen_user_rl(*args, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    return Started(proc, lines, reader)
