"""`user-rl train` with teleop.enabled: every edge, placed by Ray in a process of its own, serves
its robot's page; the launch records the pages in the run directory and `user-rl teleop` lists them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from user_rl.testing.wait import wait_for_run_dir, wait_until

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "MUJOCO_GL": "egl"}


@pytest.mark.timeout(600)
def test_a_launched_fleet_records_each_robots_teleop_page(tmp_path: Path) -> None:
    train = subprocess.Popen(
        [sys.executable, "-m", "user_rl.cli", "train", "configs/reach.yaml", f"run_root={tmp_path}",
         "fleet.num_robots=2", "teleop.enabled=true", "stop.max_wall_s=300", "stop.max_env_steps=3000",
         "policy.hidden=[32]"],
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(train.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        run_dir = wait_for_run_dir(lines, 180)
        pages = run_dir / "teleop.json"
        wait_until(lambda: pages.exists() and len(json.loads(pages.read_text())["robots"]) == 2, 180,
                   "both edges' pages recorded")
        token = json.loads(pages.read_text())["token"]
        assert token not in (run_dir / "config.yaml").read_text()  # the token is only in the owner-only file
        listed = subprocess.run([sys.executable, "-m", "user_rl.cli", "teleop", str(run_dir), "--list"], cwd=REPO,
                                env=ENV, capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        robots = dict(line.split() for line in listed.stdout.splitlines())
        assert set(robots) == {"mujoco_reach-0", "mujoco_reach-1"}, robots
        for robot_id, url in robots.items():  # each page is served by that robot's edge process
            address, _, query = url.partition("?")
            with urllib.request.urlopen(f"{address}api/state?{query}", timeout=10) as response:
                assert json.loads(response.read())["robot"] == robot_id
        assert train.wait(400) == 0, "".join(lines[-40:])
    finally:
        if train.poll() is None:
            train.kill()
    reader.join(10)
    output = "".join(lines)
    assert "teleop page for " in output and "`user-rl teleop " in output
