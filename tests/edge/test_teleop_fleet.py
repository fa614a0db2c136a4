"""`user-rl teleop`: every robot's page, from what the launch recorded (teleop.json in the run
directory) or from a page's address (the console that shows them: test_teleop_console.py)."""

from __future__ import annotations

import stat
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.edge.test_teleop_browser import http_status
from tests.support.teleop import teleop_fleet
from user_rl.cli import main
from user_rl.edge.teleop.fleet import read_pages, write_pages

TOKEN = "fleet-test-token-0123456789"
REACH = {"type": "mujoco_reach", "options": {"obs_mode": "state", "control_hz": 20}}


def test_the_run_records_every_robots_page_and_list_prints_them(running, tmp_path: Path, capsys) -> None:
    learner, edges = running(
        teleop_fleet(2, 20, f"teleop.token={TOKEN}"),
        REACH,
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # What the launch records: each edge's page (from its status), with the run's token, owner-only.
    assert write_pages(run_dir, TOKEN, {e.robot.descriptor.id: e.status()["teleop"] for e in edges})
    assert not write_pages(run_dir, TOKEN, {e.robot.descriptor.id: e.status()["teleop"] for e in edges})  # unchanged
    assert stat.S_IMODE((run_dir / "teleop.json").stat().st_mode) == 0o600

    capsys.readouterr()
    assert main(["teleop", str(run_dir), "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["mujoco_reach-0", "mujoco_reach-1"]
    for line, edge in zip(lines, edges):
        url = line.split()[1]
        assert url == edge.teleop.url
        status, page = http_status(url)
        assert status == 200 and edge.robot.descriptor.id in page
    # A robot's page given by the address its edge printed: the robot's id is asked for.
    assert main(["teleop", edges[1].teleop.url, "--list"]) == 0
    assert capsys.readouterr().out.split()[0] == "mujoco_reach-1"
    assert main(["teleop", edges[1].teleop.address, "--list"]) == 2  # no token: said, not a traceback
    assert "needs its token" in capsys.readouterr().err


def test_a_run_without_teleop_pages_is_named_in_the_error(tmp_path: Path, capsys) -> None:
    assert main(["teleop", str(tmp_path), "--list"]) == 2
    assert "holds no teleop.json: was it launched with teleop.enabled=true" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="neither a run directory nor a page address"):
        read_pages(str(tmp_path / "missing"))


def test_a_robot_with_cameras_shows_its_camera_observations(running) -> None:
    import cv2
    import numpy as np

    _, (edge,) = running(
        teleop_fleet(1, 20),
        {"type": "mujoco_reach", "options": {"obs_mode": "image", "image_size": 32, "control_hz": 20}},
    )
    server = edge.teleop
    assert server.cameras == ["image"] and not server.renders
    token = f"?token={server.token}"
    status, _ = http_status(f"{server.address}api/frame/view{token}")
    assert status == 404
    with urllib.request.urlopen(f"{server.address}api/frame/image{token}", timeout=10) as response:
        assert response.headers["Content-Type"] == "image/jpeg"
        frame = cv2.imdecode(np.frombuffer(response.read(), np.uint8), cv2.IMREAD_COLOR)
    assert frame.shape == (32, 32, 3) and frame.std() > 0


def test_the_launch_prints_every_robots_page_itself(tmp_path: Path) -> None:
    """The edges' own "teleop page for ROBOT: ADDRESS" lines reach the launch's output through Ray, which
    merges lines that differ only in words with digits (robot ids, ports): robot 0's page went unshown.
    The launch prints each new page's address itself (never the token), and the console's command."""
    from pydantic import SecretStr

    from user_rl.launch.training import _record_teleop_pages

    lines: list[str] = []
    addresses = {f"arm-{i}": f"http://127.0.0.1:{41000 + i}/" for i in range(3)}
    run = SimpleNamespace(
        cfg=SimpleNamespace(teleop=SimpleNamespace(enabled=True, token=SecretStr(TOKEN))),
        fleet=SimpleNamespace(active=list(addresses), last={r: {"teleop": a} for r, a in addresses.items()}),
        run_dir=tmp_path,
        out=lines.append,
    )
    _record_teleop_pages(run)
    assert lines[:3] == [f"teleop page for {r}: {a}" for r, a in addresses.items()]
    assert f"`user-rl teleop {tmp_path}` serves the fleet console" in lines[3] and len(lines) == 4
    assert not any(TOKEN in line for line in lines)
    lines.clear()
    _record_teleop_pages(run)  # nothing changed: nothing printed
    assert lines == []
    run.fleet.last["arm-1"] = {"teleop": "http://127.0.0.1:42001/"}  # arm-1's edge restarted
    _record_teleop_pages(run)
    assert lines[0] == "teleop page for arm-1: http://127.0.0.1:42001/" and len(lines) == 2
