"""Who may re-arm an e-stop from the teleop page (issue 29, point 2): viewers stop but never re-arm;
an operator re-arms with a credential and a confirmation and is named in the log and status; a
stop set from the CLI is cleared only by the CLI or an operator who types its reason. Real
headless Chromium, a real learner and edge daemon (MuJoCo reach), the real `user-rl estop` CLI."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from tests.edge.test_teleop_browser import browser, text  # noqa: F401  (a fixture)
from tests.support.teleop import teleop_fleet
from user_rl.edge.teleop.authority import NotAllowed, check_rearm, read_operators
from user_rl.testing.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
ALICE = "alice-operator-credential-0123"


def operators_file(tmp_path: Path) -> Path:
    path = tmp_path / "operators"
    path.write_text(f"# who may re-arm\nalice {ALICE}\n")
    path.chmod(0o600)
    return path


def cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "user_rl.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def rearm(driver, credential: str, tick: bool = False, reason: str | None = None, button: str = "rearm") -> None:
    """Open the page's re-arm dialog (a robot's page; the console's with button="rearm-all") and submit it."""
    wait_until(lambda: driver.find_element(By.ID, button).is_enabled(), 10, "the re-arm button (the robot is stopped)")
    driver.find_element(By.ID, button).click()
    wait_until(lambda: driver.find_element(By.ID, "rearm-dialog").is_displayed(), 5, "the re-arm dialog")
    field = driver.find_element(By.ID, "operator-credential")
    field.clear()
    field.send_keys(credential)
    if tick:
        driver.find_element(By.ID, "rearm-safe").click()
    if reason is not None:
        driver.find_element(By.ID, "rearm-reason").send_keys(reason)
    driver.find_element(By.ID, "rearm-confirm").click()


def test_viewers_stop_operators_rearm_with_confirmation_and_cli_stops_need_their_reason(
    running,
    browser,  # noqa: F811  (the fixture imported above)
    tmp_path,
    caplog,
) -> None:
    caplog.set_level(logging.WARNING)
    _, (edge,) = running(
        teleop_fleet(
            1, 20, "teleop.frame_hz=2", "teleop.view_size=32", f"teleop.operators_file={operators_file(tmp_path)}"
        ),
        {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 100, "control_hz": 20}},
    )
    server = edge.teleop
    robot_id = server.robot_id
    bob, alice = browser(), browser()
    bob.get(server.url + "&name=bob")
    alice.get(server.url + "&name=alice")
    for driver in (bob, alice):
        wait_until(lambda: text(driver, "connection") == "connected", 30, "the page to connect")

    # Bob, a viewer, stops the robot; he cannot re-arm it: no credential, or a wrong one, is refused.
    bob.find_element(By.ID, "estop").click()
    wait_until(lambda: edge.estops == 1, 10, "the robot to stop")
    assert edge.status()["estop"]["source"] == "page" and edge.status()["estop"]["by"] == "bob"
    rearm(bob, "", tick=True)
    wait_until(lambda: "operator credential" in text(bob, "message"), 10, "bob to be refused")
    bob.execute_script(
        "window.teleop.ws.send(JSON.stringify({type: 'rearm', credential: 'not-the-credential-000', "
        "confirm: 'teleop page: bob'}));"
    )
    wait_until(lambda: "viewers may stop the robot but not re-arm" in text(bob, "message"), 10, "a wrong credential")
    # An operator's credential alone is not enough either: the confirmation must name the stop.
    bob.execute_script(f"window.teleop.ws.send(JSON.stringify({{type: 'rearm', credential: '{ALICE}', confirm: ''}}));")
    wait_until(lambda: "confirm the stop you clear" in text(bob, "message"), 10, "no confirmation")
    steps = edge.steps
    assert edge.estop.tripped() == "teleop page: bob"

    # Alice, an operator, ticks that the robot is safe and re-arms: she is named in status, page and log.
    rearm(alice, ALICE, tick=True)
    wait_until(lambda: edge.estop.tripped() is None, 10, "alice to re-arm")
    wait_until(lambda: edge.steps > steps + 5, 10, "steps after re-arming")
    rearmed = edge.status()["rearmed"]
    assert rearmed["by"] == "operator alice (teleop page, alice)" and rearmed["reason"] == "teleop page: bob"
    wait_until(lambda: "operator alice" in text(bob, "rearmed"), 10, "the re-arm on bob's page")
    wait_until(lambda: any("re-armed by operator alice" in r.getMessage() for r in caplog.records), 10, "the log")

    # A stop from the robot's controller (the CLI): alice must type its reason; the tick box is not offered.
    spool_root = tmp_path / "spool"  # the CLI finds a robot's latch at ROOT/<robot id>/ESTOP
    spool_root.mkdir()
    (spool_root / robot_id).symlink_to(edge.estop.path.parent)
    spool_root = str(spool_root)
    assert "EMERGENCY STOP (gripper jammed)" in cli(
        "estop", robot_id, "--reason", "gripper jammed", "--spool", spool_root
    )
    wait_until(lambda: edge.estops == 2, 10, "the CLI's stop")
    wait_until(lambda: "set by the cli" in text(alice, "estop-banner"), 10, "the stop's source on the page")
    rearm(alice, ALICE, reason="gripper")
    assert not alice.find_element(By.ID, "rearm-safe-row").is_displayed()
    wait_until(lambda: "type its reason exactly" in text(alice, "message"), 10, "a half-typed reason refused")
    assert edge.estop.tripped() == "gripper jammed"
    alice.find_element(By.ID, "rearm-reason").send_keys(" jammed")
    alice.find_element(By.ID, "rearm-confirm").click()
    wait_until(lambda: edge.estop.tripped() is None, 10, "alice to clear the CLI's stop")
    assert edge.status()["rearmed"]["source"] == "cli"

    # The CLI clears any stop, and says who did.
    bob.find_element(By.ID, "estop").click()
    wait_until(lambda: edge.estops == 3, 10, "bob's second stop")
    out = cli("rearm", robot_id, "--spool", spool_root)
    assert f"{robot_id}: re-armed by cli:" in out and "page stop: teleop page: bob" in out
    assert edge.status()["rearmed"]["by"].startswith("cli:")


def test_the_operators_file_is_owner_only_and_without_one_nobody_rearms_from_a_page(tmp_path) -> None:
    path = operators_file(tmp_path)
    assert read_operators(path) == {"alice": ALICE}
    stop = {"reason": "gripper jammed", "source": "cli", "by": "root", "time": 0.0}
    assert check_rearm(stop, ALICE, "gripper jammed", str(path)) == "alice"
    with pytest.raises(NotAllowed, match="teleop.operators_file is not set"):
        check_rearm(stop, ALICE, "gripper jammed", None)
    path.chmod(0o644)
    with pytest.raises(ValueError, match="others may read it: chmod 600"):
        read_operators(path)
    path.write_text("alice short\n")
    path.chmod(0o600)
    with pytest.raises(ValueError, match=r"operators:1: expected `NAME TOKEN`"):
        read_operators(path)
