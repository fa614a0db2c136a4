"""The README's two set-up commands: CI runs the test one; the train one works from a fresh clone."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    return [b.strip() for b in blocks if b.strip().startswith(("pip install", "apt-get update"))]


def test_ci_runs_the_readme_test_command() -> None:
    train_cmd, test_cmd = readme_commands()
    assert "user-rl train" in train_cmd and "pytest" in test_cmd
    assert test_cmd in (REPO / ".ci" / "run").read_text()


@pytest.mark.timeout(600)
def test_readme_train_command_works_from_a_fresh_clone(tmp_path: Path) -> None:
    """Clone, install into a fresh venv (reusing this machine's packages), start training."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    train_cmd = readme_commands()[0]
    env = {
        **os.environ,
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        "MUJOCO_GL": "egl",
        "PYTHONPATH": "",
    }
    proc = subprocess.Popen(
        ["bash", "-c", train_cmd],
        cwd=clone,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    seen: list[str] = []
    deadline = time.monotonic() + 480
    try:
        for line in proc.stdout:  # wait until the fleet is learning: a published policy and steps
            seen.append(line)
            match = re.search(r"env\s+([\d,]+) .*policy v(\d+)", line)
            if match and int(match.group(1).replace(",", "")) > 0 and int(match.group(2)) > 0:
                break
            assert time.monotonic() < deadline, "".join(seen[-40:])
        else:
            pytest.fail("training ended before it made progress:\n" + "".join(seen[-40:]))
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the launcher shuts Ray down
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    # It ran the clone's code, installed into the fresh venv.
    assert (clone / "runs").is_dir() and any((clone / "runs").glob("reach-*/config.yaml"))
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import user_rl; print(user_rl.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert str(clone) in site.stdout, site.stdout + site.stderr
