"""`user-rl teleop`: the fleet page lists every robot with a link to its own page, from what the
launch recorded (teleop.json in the run directory) or from a page's address."""

from __future__ import annotations

import stat
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.teleop import teleop_fleet
from user_rl.cli import main
from user_rl.edge.teleop.fleet import read_pages, serve_fleet_page, write_pages
from user_rl.testing.wait import wait_until

TOKEN = "fleet-test-token-0123456789"
REACH = {"type": "mujoco_reach", "options": {"obs_mode": "state", "control_hz": 20}}


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_fleet_page_links_every_robots_page(running, tmp_path: Path, capsys) -> None:
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
        status, page = get(url)
        assert status == 200 and edge.robot.descriptor.id in page
    # A robot's page given by the address its edge printed: the robot's id is asked for.
    assert main(["teleop", edges[1].teleop.url, "--list"]) == 0
    assert capsys.readouterr().out.split()[0] == "mujoco_reach-1"
    assert main(["teleop", edges[1].teleop.address, "--list"]) == 2  # no token: said, not a traceback
    assert "needs its token" in capsys.readouterr().err

    # The fleet page itself: token required, a row and a link per robot, and where each one is.
    stop, urls = threading.Event(), []
    thread = threading.Thread(
        target=serve_fleet_page,
        args=(str(run_dir),),
        kwargs={"out": lambda line: None, "ready": urls.append, "stop": stop},
        daemon=True,
    )
    thread.start()
    try:
        wait_until(lambda: urls, 10, "the fleet page")
        assert get(urls[0].partition("?")[0])[0] == 401
        status, page = get(urls[0])
        assert status == 200
        for edge in edges:
            assert f'href="{edge.teleop.url}"' in page and ">policy<" in page
    finally:
        stop.set()
        thread.join(5)


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
    status, _ = get(f"{server.address}api/frame/view{token}")
    assert status == 404
    with urllib.request.urlopen(f"{server.address}api/frame/image{token}", timeout=10) as response:
        assert response.headers["Content-Type"] == "image/jpeg"
        frame = cv2.imdecode(np.frombuffer(response.read(), np.uint8), cv2.IMREAD_COLOR)
    assert frame.shape == (32, 32, 3) and frame.std() > 0
