"""`user-rl train` with teleop.enabled: every edge, placed by Ray in a process of its own, serves
its robot's page; the launch records the pages in the run directory and `user-rl teleop` lists them.
The page token stays with the operator: it is in no log (the launch's output, Ray's worker logs), not
in config.yaml nor the checkpoint; only in the owner-only teleop.json."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.harness import run_cli
from tests.support.cli import start_user_rl
from user_rl.testing.wait import wait_for_run_dir, wait_until

ENV = {**os.environ, "MUJOCO_GL": "egl"}
TOKEN = "operator-only-Tk7Qz9xWc2Lm4Rb8"  # given in the config: the worst case (it used to reach config.yaml)


def files_holding(root: Path, secret: bytes) -> list[str]:
    """Every file under `root` whose bytes contain `secret` (torch checkpoints are stored uncompressed)."""
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and secret in p.read_bytes()]


@pytest.mark.timeout(600)
def test_a_launched_fleet_records_each_robots_teleop_page(tmp_path: Path) -> None:
    ray_tmp = Path(
        tempfile.mkdtemp(prefix="ray", dir="/tmp")
    )  # this launch's own Ray session logs (short: socket paths)
    train, lines, reader = start_user_rl(
        "train",
        "configs/reach.yaml",
        f"run_root={tmp_path}",
        "fleet.num_robots=2",
        "teleop.enabled=true",
        f"teleop.token={TOKEN}",
        "stop.max_wall_s=300",
        "stop.max_env_steps=1200",
        "algo.learning_starts=200",
        "algo.batch_size=32",
        "stop.eval_episodes=2",
        "policy.hidden=[32]",
        env={**ENV, "RAY_TMPDIR": str(ray_tmp)},
    )
    try:
        run_dir = wait_for_run_dir(lines, 180)
        pages = run_dir / "teleop.json"
        wait_until(
            lambda: pages.exists() and len(json.loads(pages.read_text())["robots"]) == 2,
            180,
            "both edges' pages recorded",
        )
        assert json.loads(pages.read_text())["token"] == TOKEN
        assert stat.S_IMODE(pages.stat().st_mode) == 0o600
        listed = run_cli("teleop", str(run_dir), "--list", timeout=60)
        assert listed.returncode == 0, listed.stderr
        robots = dict(line.split() for line in listed.stdout.splitlines())
        assert set(robots) == {"mujoco_reach-0", "mujoco_reach-1"}, robots
        for robot_id, url in robots.items():  # each page is served by that robot's edge process
            address, _, query = url.partition("?")
            with urllib.request.urlopen(f"{address}api/state?{query}", timeout=10) as response:
                assert json.loads(response.read())["robot"] == robot_id
        assert train.wait(400) == 0, "".join(lines[-40:])
        reader.join(10)
        output = "".join(lines)
        assert "`user-rl teleop " in output
        # Every robot's page, printed by the launch itself: Ray merges the edges' own similar lines.
        for robot_id, url in robots.items():
            assert f"teleop page for {robot_id}: {url.partition('?')[0]}\n" in output
        # The token is in the owner-only page list and nowhere else: not in the launch's output, not in
        # config.yaml or checkpoint.pt, not in any of Ray's logs (0644: any local user reads them).
        assert (run_dir / "checkpoint.pt").is_file() and list(ray_tmp.rglob("worker-*.out"))
        assert TOKEN not in output
        assert files_holding(run_dir, TOKEN.encode()) == [str(pages)]
        assert files_holding(ray_tmp, TOKEN.encode()) == []
    finally:
        if train.poll() is None:
            train.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
