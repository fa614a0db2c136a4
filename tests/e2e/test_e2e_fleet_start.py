"""Starting is not hung: an edge whose robot driver takes longer to build than the launch's status
timeout (a loaded box) is waited for and costs no restart, while an edge stuck in a stage of its
build is still restarted. Real Ray actors (the launch's own `EdgeService` and `FleetHealth`) and a
robot driver installed as a plugin, whose constructor sleeps."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import ray

from user_rl.config import build_config
from user_rl.launch import fleet_health
from user_rl.launch.fleet_health import FleetHealth
from user_rl.services import EdgeService
from user_rl.testing.wait import free_port

STATUS_TIMEOUT_S = 2.0  # the launch's status timeout, short: a start of START_S is "slow" against it
START_S = 6.0
START_TIMEOUT_S = 25.0  # a Ray worker of a loaded box (two fleets on 2 cores) took over 12 s to come up

DRIVER = '''
import time
from user_rl.sim.reach import ReachRobot


class SlowReach(ReachRobot):
    """The reach sim, whose driver takes `start_s` to build (robot `hang_id`: forever)."""

    def __init__(self, *, robot_id="slow-0", seed=None, obs_mode="state", episode_steps=50, start_s=0.0, hang_id=""):
        time.sleep(3600 if robot_id == hang_id else start_s)
        super().__init__(robot_id=robot_id, seed=seed, obs_mode=obs_mode, episode_steps=episode_steps)
'''


def install_driver(site: Path) -> None:
    """The driver package and its dist-info (entry point `user_rl.robots: slow_reach`), as pip would."""
    (site / "slow_reach_driver").mkdir(parents=True)
    (site / "slow_reach_driver" / "__init__.py").write_text(DRIVER)
    info = site / "slow_reach_driver-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: slow-reach-driver\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[user_rl.robots]\nslow_reach = slow_reach_driver:SlowReach\n")


@pytest.fixture
def local_ray(tmp_path: Path, monkeypatch):
    site = tmp_path / "site"
    install_driver(site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("MUJOCO_GL", "egl")
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.timeout(180)
def test_a_slow_starting_edge_is_waited_for_and_a_hung_start_restarted(local_ray, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(fleet_health, "STATUS_TIMEOUT_S", STATUS_TIMEOUT_S)
    cfg = build_config(
        {
            "robot": {"type": "slow_reach", "options": {"start_s": START_S, "hang_id": "slow_reach-1"}},
            "policy": {"type": "mlp", "hidden": [16]},
            "fleet": {"num_robots": 2, "pace_to_learner": False, "control_hz": 20},
        }
    )
    addresses = {"data": f"tcp://127.0.0.1:{free_port()}", "weights": f"tcp://127.0.0.1:{free_port()}"}

    def spawn(index: int):
        return (
            ray.remote(EdgeService)
            .options(num_cpus=0)
            .remote(cfg.model_dump(), index, addresses, str(tmp_path / "spool"))
        )

    lines: list[str] = []
    began = time.monotonic()
    fleet = FleetHealth(
        spawn, ["slow_reach-0", "slow_reach-1"], max_restarts=1, out=lines.append, start_timeout_s=START_TIMEOUT_S
    )
    stages = []
    while "slow_reach-0" not in fleet.started:  # what `wait_started` does, watching the stages go by
        stages.append(fleet.poll().get("slow_reach-0", {}).get("stage"))
        time.sleep(0.2)
    took = time.monotonic() - began
    try:
        # The slow edge: waited for past the status timeout, no restart spent, and it said what it was doing.
        assert took > START_S > STATUS_TIMEOUT_S and fleet.restarts["slow_reach-0"] == 0, lines
        assert "building the robot (slow_reach driver)" in stages, stages
        assert fleet.last["slow_reach-0"]["steps"] >= 0 and "starting" not in fleet.last["slow_reach-0"]
        # The hung one: restarted once it showed no progress for start_timeout_s, then failed.
        fleet.wait_started()
        assert fleet.restarts["slow_reach-1"] == 1 and "slow_reach-1" in fleet.failed, lines
        # The first start was seen stuck where it hung; the restart may fail there too or, on a loaded machine,
        # before its process came up at all: either way no restarts are left and it says so.
        first_stuck = "robot slow_reach-1: stuck starting: building the robot (slow_reach driver)"
        assert any(line.startswith(first_stuck) for line in lines), lines
        assert "no restarts left (fleet.max_restarts=1)" in fleet.failed["slow_reach-1"], lines
        assert not [line for line in lines if line.startswith("robot slow_reach-0")], lines
    finally:
        fleet.finish()
