"""The fleet console (`user-rl teleop RUN_DIR`) in a real headless Chromium against a real learner
and real edge daemons serving their robots' pages: every robot's camera on one page, a robot taken
over from it in two key presses, stop-all and re-arm-all; and the console's token, which is never
printed. Screenshots are saved under the test's run directory and kept (their path is printed)."""

from __future__ import annotations

import os
import stat
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.edge.test_teleop_authority import rearm
from tests.edge.test_teleop_browser import http_status
from tests.edge.test_teleop_takeover import chromium_driver
from tests.support.teleop import teleop_fleet
from user_rl.edge.teleop.console import Console, serve_console
from user_rl.edge.teleop.fleet import write_pages
from user_rl.testing.wait import wait_until

TOKEN = "console-test-token-0123456789"
OPERATOR = "alice-operator-credential-0123"
HZ = 20  # control steps a second: eight control loops, their pages and a learner share the test's process
WINDOW_S = 10.0  # frame ages are measured over this long


@pytest.fixture
def browser():
    """Headless Chromium browsers with `flags`; quit afterwards."""
    started = []

    def start(*flags: str):
        started.append(chromium_driver(*flags))
        return started[-1]

    yield start
    for driver in started:
        driver.quit()


@contextmanager
def console_for(run_dir: Path, lines: list[str]):
    """Serve the console of `run_dir` on a thread (what `user-rl teleop RUN_DIR` runs); yield it."""
    stop, ready = threading.Event(), []
    thread = threading.Thread(
        target=serve_console,
        args=(str(run_dir),),
        kwargs={"out": lines.append, "ready": ready.append, "stop": stop},
        daemon=True,
    )
    thread.start()
    try:
        wait_until(lambda: ready, 10, "the console to listen")
        yield ready[0]
    finally:
        stop.set()
        thread.join(5)


def fleet_run(running, tmp_path: Path, robots: int, *more: str):
    """A learner and `robots` unpaced reach arms serving their pages, recorded in a run directory as a
    launch does (the page renders the arm's view: its observations are state)."""
    learner, edges = running(
        teleop_fleet(robots, HZ, f"teleop.token={TOKEN}", *more),
        {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 100, "control_hz": HZ}},
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_pages(run_dir, TOKEN, {e.robot.descriptor.id: e.status()["teleop"] for e in edges})
    return learner, edges, run_dir


def operators_file(tmp_path: Path) -> Path:
    path = tmp_path / "operators"
    path.write_text(f"alice {OPERATOR}\n")
    path.chmod(0o600)
    return path


def open_console(browser, console: Console, robots: int):
    driver = browser("--window-size=1700,1000")
    driver.get(console.url + "&name=alice")
    wait_until(
        lambda: driver.execute_script(
            "return fleetConsole.links.length === arguments[0] && fleetConsole.links.every(l => l.frames >= 3)",
            robots,
        ),
        60,
        "frames on every tile",
    )
    return driver


def screenshot(driver, path: Path) -> None:
    """Saved under the test's run directory; with $USER_RL_DOCS_IMAGES also there (docs/images: the
    console docs/people.md shows is this test's)."""
    driver.save_screenshot(str(path))
    print(f"\nscreenshot: {path}")
    if os.environ.get("USER_RL_DOCS_IMAGES"):
        driver.save_screenshot(str(Path(os.environ["USER_RL_DOCS_IMAGES"]) / path.name))


def test_eight_robots_on_one_console_and_robot_5_taken_over_in_two_key_presses(running, browser, tmp_path) -> None:
    _, edges, run_dir = fleet_run(running, tmp_path, 8, "teleop.frame_hz=10", "teleop.view_size=64")
    lines: list[str] = []
    with console_for(run_dir, lines) as console:
        driver = open_console(browser, console, 8)
        tiles = driver.find_elements(By.CSS_SELECTOR, "#grid .tile")
        assert [t.find_element(By.CSS_SELECTOR, ".name").text for t in tiles] == [e.robot.descriptor.id for e in edges]
        assert [t.find_element(By.CSS_SELECTOR, ".number").text for t in tiles] == [str(i) for i in range(1, 9)]
        # Each tile's state, from the robot page's state message and the tile fields beside it (tiles.py).
        wait_until(lambda: "steps" in tiles[0].find_element(By.CSS_SELECTOR, ".interventions").text, 10, "rates")
        assert tiles[0].find_element(By.CSS_SELECTOR, ".link").text.startswith("ok")
        assert tiles[0].find_element(By.CSS_SELECTOR, ".policy").text == "none yet"  # random warm-up actions
        assert tiles[0].find_element(By.CSS_SELECTOR, ".episode").text.endswith("/100")

        # Every tile keeps getting frames: camera -> screen age measured in the page, over a window.
        driver.execute_script("fleetConsole.clearAges()")
        time.sleep(WINDOW_S)
        ages = driver.execute_script("return fleetConsole.frameAges()")
        screenshot(driver, tmp_path / "console-8-robots.png")
        counts = {robot: len(a) for robot, a in ages.items()}
        every = np.concatenate([np.array(a) for a in ages.values()])
        p50, p99 = np.percentile(every, 50), np.percentile(every, 99)
        print(
            f"frame age, camera -> screen, 8 robots at {HZ} Hz, 10 frames/s, 64 px, over {WINDOW_S:g} s: "
            f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {every.max():.0f} ms ({len(every)} frames: {counts})"
        )
        assert min(counts.values()) >= 0.5 * 5 * WINDOW_S, counts  # every tile updates
        assert p99 <= 500, (p50, p99)

        # "5" focuses the fifth robot (its page beside the grid, with the keyboard); Space takes it over.
        robot = edges[4]
        presses = ["5", Keys.SPACE]
        ActionChains(driver).send_keys(presses[0]).perform()
        wait_until(lambda: driver.execute_script("return fleetConsole.focusReady"), 20, "robot 5's page")
        assert driver.execute_script("return fleetConsole.focused") == robot.robot.descriptor.id
        assert driver.execute_script("return document.activeElement.id") == "robot-page"
        driver.switch_to.frame("robot-page")
        wait_until(lambda: driver.find_element(By.ID, "connection").text == "connected", 20, "robot 5's page")
        driver.switch_to.default_content()
        ActionChains(driver).send_keys(presses[1]).perform()
        wait_until(lambda: robot.teleop.source.driver[1] == "alice", 10, "alice to drive robot 5")
        assert len(presses) <= 2
        wait_until(lambda: "person: alice" in tiles[4].text, 10, "the tile to say who drives")
        screenshot(driver, tmp_path / "console-robot-5-taken-over.png")
        # A digit in the robot's page goes up to the console (the page passes it on): robot 2 now.
        ActionChains(driver).send_keys("2").perform()
        second = edges[1].robot.descriptor.id
        wait_until(lambda: driver.execute_script("return fleetConsole.focused") == second, 10, "robot 2's page")


def test_stop_all_stops_every_robot_and_rearming_all_needs_the_confirmation(running, browser, tmp_path) -> None:
    more = ("teleop.frame_hz=2", "teleop.view_size=32", f"teleop.operators_file={operators_file(tmp_path)}")
    _, edges, run_dir = fleet_run(running, tmp_path, 3, *more)
    with console_for(run_dir, []) as console:
        driver = open_console(browser, console, 3)
        driver.find_element(By.ID, "stop-all").click()
        wait_until(lambda: all(e.estop.tripped() for e in edges), 10, "every robot's latch to trip")
        assert {e.estop.tripped() for e in edges} == {"teleop page: console:alice"}
        wait_until(lambda: len(driver.find_elements(By.CSS_SELECTOR, ".tile.stopped")) == 3, 10, "stopped tiles")
        screenshot(driver, tmp_path / "console-stopped.png")
        steps = [e.steps for e in edges]
        time.sleep(0.5)
        assert [e.steps for e in edges] == steps

        def rearm_all(credential: str, tick: bool) -> None:
            rearm(driver, credential, tick, button="rearm-all")

        def messages() -> list[str]:
            return [m.text for m in driver.find_elements(By.CSS_SELECTOR, ".tile .message")]

        rearm_all(OPERATOR, tick=False)  # one click is never enough: the tick is missing, nothing is sent
        assert "tick that you checked the robots" in driver.find_element(By.ID, "fleet-message").text
        # Sent anyway (a page that skips the tick), the robots refuse it: the confirmation is the stop's reason.
        driver.execute_script(
            "fleetConsole.links.forEach(l => l.send({type: 'rearm', credential: arguments[0], confirm: ''}))", OPERATOR
        )
        wait_until(lambda: all("confirm the stop you clear" in m for m in messages()), 10, "refusals")
        rearm_all("not-an-operator-0123456789", tick=True)  # a viewer's tick is not an operator's
        wait_until(lambda: all("needs an operator credential" in m for m in messages()), 10, "refusals")
        assert all(e.estop.tripped() for e in edges)
        rearm_all(OPERATOR, tick=True)
        wait_until(lambda: not any(e.estop.tripped() for e in edges), 10, "every robot re-armed")
        assert {e.status()["rearmed"]["by"] for e in edges} == {"operator alice (teleop page, console:alice)"}
        wait_until(lambda: all(e.steps > s + 5 for e, s in zip(edges, steps)), 20, "every robot stepping again")
        wait_until(lambda: not driver.find_elements(By.CSS_SELECTOR, ".tile.stopped"), 10, "the tiles to clear")


def test_the_console_prints_no_token_and_keeps_it_in_an_owner_only_file(tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_pages(run_dir, TOKEN, {"arm-0": "http://127.0.0.1:9/", "arm-1": "http://127.0.0.1:10/"})
    lines: list[str] = []
    with console_for(run_dir, lines) as console:
        (line,) = lines
        assert console.address in line and console.token not in line and TOKEN not in line
        url_file = run_dir / "console.url"
        assert str(url_file) in line and stat.S_IMODE(url_file.stat().st_mode) == 0o600
        url = url_file.read_text().strip()
        assert url == console.url and console.token in url
        for wrong in ("", "?token=wrong-token-0123456789"):
            for path in ("", "api/robots", "console.js"):
                status, body = http_status(console.address + path + wrong)
                assert status == 401 and str(url_file) in body, (path, wrong, status, body)
        status, page = http_status(url)
        assert status == 200 and "console.js" in page
        status, body = http_status(url.replace("/?", "/api/robots?"))
        assert status == 200 and '"robot": "arm-0", "number": 1' in body and TOKEN in body
        # teleop.json is read again on each request: a restarted edge shows with its new address.
        write_pages(run_dir, TOKEN, {"arm-0": "http://127.0.0.1:11/", "arm-1": "http://127.0.0.1:10/"})
        assert "127.0.0.1:11" in http_status(url.replace("/?", "/api/robots?"))[1]
