"""A keyboard-only session on the teleop page (issue 33, points 2-4): take over, drive, label success,
label failure and undo it, discard, e-stop and re-arm, with no mouse, asserted where it counts: in
the learner's buffer (actor, labels, episode ends) and on the robot's latch. It runs the config
docs/people.md shows (configs/reach_teleop.yaml: 20 Hz, paced sims) and measures key -> robot there.

The learner does not train here (`algo.learning_starts` out of reach): in this fixture it is a thread
of the test's own process, where its updates would take the interpreter from the edge's loop; on a
deployment it runs on another machine. Real headless Chromium, a real learner and edge daemon."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import yaml
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.edge.test_teleop_authority import ALICE, operators_file
from tests.edge.test_teleop_browser import browser, fresh_episode, text  # noqa: F401  (a fixture)
from tests.support.teleop import teleop_fleet
from user_rl.cloud.buffer.rows import KIND_RECORD
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
KEY_TO_ROBOT_P99_MS = 100.0  # issue 33: with the docs' teleop config, on this 2-core machine


def press(page, *keys: str) -> None:
    ActionChains(page).send_keys(*keys).perform()


def test_a_keyboard_only_session_takes_over_drives_labels_undoes_discards_stops_and_rearms(
    running,
    browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    docs_config = yaml.safe_load((REPO / "configs/reach_teleop.yaml").read_text())
    learner, edges = running(
        ["algo.learning_starts=1000000", f"teleop.operators_file={operators_file(tmp_path)}"], base=docs_config
    )
    edge, server = edges[0], edges[0].teleop
    limit = docs_config["robot"]["options"]["episode_steps"]
    records: list = []  # (episode, step, actor, label, ended, action[0]) of every step
    lock = threading.Lock()

    def watch(record) -> None:
        with lock:
            records.append((record.episode, record.step, record.actor, record.label, record.ended, record.action[0]))

    edge.step_watchers.append(watch)
    alice = browser()
    alice.get(server.url + "&name=alice")
    wait_until(lambda: text(alice, "connection") == "connected", 30, "the page to connect")
    assert "Space" in text(alice, "operator-keys") and "Esc" in text(alice, "operator-keys")

    # Space takes over: one key.
    press(alice, Keys.SPACE)
    wait_until(lambda: server.source.driver[1] == "alice", 10, "alice to drive")
    wait_until(lambda: text(alice, "driver") == "teleop:alice (you)", 10, "her page to say she drives")

    # She drives with D: short presses, each a command whose latency the robot measures.
    for _ in range(50):
        ActionChains(alice).key_down("d").perform()
        time.sleep(0.12)
        ActionChains(alice).key_up("d").perform()
        time.sleep(0.08)
    wait_until(lambda: (server.key_latency.summary() or {}).get("n", 0) >= 90, 10, "her commands' latencies")
    latency = server.key_latency.summary()
    print(
        f"key -> robot with configs/reach_teleop.yaml: p50 {latency['p50_ms']} ms, p99 {latency['p99_ms']} ms "
        f"over {latency['n']} commands"
    )
    assert latency["p99_ms"] <= KEY_TO_ROBOT_P99_MS, latency
    wait_until(lambda: "p99" in text(alice, "key-latency"), 5, "the latency on the page")
    with lock:
        moved = [a for _, _, actor, _, _, a in records if actor == pb.ACTOR_HUMAN and a > 0.5]
    # her key moved the first joint (~2 steps a press at 20 Hz; a loaded CI box stepped 17 times once)
    assert len(moved) >= 10, len(moved)
    ages = alice.execute_script("return window.teleop.frameAges.view || []")
    print(
        f"camera -> screen: p50 {np.percentile(ages, 50):.0f} ms, p99 {np.percentile(ages, 99):.0f} ms "
        f"over {len(ages)} frames"
    )
    assert len(ages) >= 10 and "ms old" in alice.find_element(By.CSS_SELECTOR, "#views figcaption").text

    def episode_with_time_for(labels_pressed: int = 1) -> int:
        """Time for this many labels' undo windows one after the other, a second between them and 3 s
        to spare (on a loaded box 5 s once did not last the undone label and the next one)."""
        seconds = labels_pressed * (server.settings.label_undo_s + 1.0) + 3.0
        return fresh_episode(edge, alice, limit, int(seconds * docs_config["fleet"]["control_hz"]))

    flat = learner.buffer.cache.flat

    def labels(episode: int) -> list[tuple[int, int, bool]]:
        label, number, kind = flat["label"].copy(), flat["episode"].copy(), flat["kind"].copy()
        rows = np.flatnonzero((label != pb.LABEL_NONE) & (number == episode) & (kind == KIND_RECORD))
        return [(int(flat["label"][r]), int(flat["label_by"][r]), bool(flat["terminated"][r])) for r in rows]

    # Enter: success, sent after its undo window; the episode ends there, labelled by a person.
    episode = episode_with_time_for()
    press(alice, Keys.RETURN)  # the main Enter key (Keys.ENTER is the keypad's, which works too)
    wait_until(lambda: alice.find_element(By.ID, "pending-label").is_displayed(), 5, "the label's undo window")
    wait_until(lambda: edge.episodes > episode, 10, "the success to end the episode")
    wait_until(lambda: labels(episode), 30, "the success label in the buffer")
    assert labels(episode) == [(pb.LABEL_SUCCESS, pb.LABEL_BY_PERSON, True)]

    # Backspace: failure; Z undoes it within the window: nothing is sent, the episode goes on.
    episode = episode_with_time_for(labels_pressed=2)
    press(alice, Keys.BACKSPACE)
    wait_until(lambda: alice.find_element(By.ID, "pending-label").is_displayed(), 5, "the failure's undo window")
    press(alice, "z")
    wait_until(lambda: "undone" in text(alice, "message"), 5, "the undo on the page")
    time.sleep(server.settings.label_undo_s + 1.0)
    assert edge.episodes == episode
    with lock:
        assert not [r for r in records if r[0] == episode and r[3] != pb.LABEL_NONE]
    # Backspace again, not undone: the episode ends as a failure (truncated, nothing to bootstrap past).
    press(alice, Keys.BACKSPACE)
    wait_until(lambda: edge.episodes > episode, 10, "the failure to end the episode")
    wait_until(lambda: labels(episode), 30, "the failure label in the buffer")
    assert labels(episode) == [(pb.LABEL_FAILURE, pb.LABEL_BY_PERSON, False)]

    # X discards the episode (re-record): it ends, and the buffer keeps it out of sampling.
    episode = episode_with_time_for()
    discarded = learner.buffer.discarded_rows
    press(alice, "x")
    wait_until(lambda: edge.episodes > episode, 10, "the discard to end the episode")
    wait_until(lambda: learner.buffer.discarded_rows > discarded, 30, "the discarded episode in the buffer")

    # Escape stops the robot; G opens the re-arm dialog: tick "safe" (Space), Tab, credential, Enter.
    press(alice, Keys.ESCAPE)
    wait_until(lambda: edge.estop.tripped() == "teleop page: alice", 5, "the e-stop")
    steps = edge.steps
    time.sleep(0.5)
    assert edge.steps == steps
    press(alice, "g")
    wait_until(lambda: alice.find_element(By.ID, "rearm-dialog").is_displayed(), 5, "the re-arm dialog")
    press(alice, Keys.SPACE, Keys.TAB, ALICE, Keys.ENTER)
    wait_until(lambda: edge.estop.tripped() is None, 10, "the re-arm")
    assert "operator alice" in edge.estop.last_rearm()["by"]
    wait_until(lambda: edge.steps > steps + 10, 10, "steps after re-arming")

    # Her rows are stored as a person's, with the policy's proposal beside them.
    actor, kind = flat["actor"].copy(), flat["kind"].copy()
    human = np.flatnonzero((actor == pb.ACTOR_HUMAN) & (kind == KIND_RECORD))
    assert len(human) >= 20 and (flat["action"][human, 0] > 0.5).sum() >= 10
    shot = tmp_path / "keyboard-session.png"
    alice.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 10_000


def test_a_gamepad_takes_over_drives_labels_and_stops(running, browser) -> None:  # noqa: F811
    """The same actions from a standard gamepad: headless Chromium has no gamepad, so the page's
    `navigator.getGamepads` is given one whose buttons and sticks the test sets (the page polls it
    every frame, as it polls a real one)."""
    _, (edge,) = running(
        teleop_fleet(1, 20.0, "teleop.frame_hz=2", "teleop.view_size=32", "teleop.speed=1.0"),
        {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 400, "control_hz": 20.0}},
    )
    server = edge.teleop
    page = browser()
    page.get(server.url + "&name=pat")
    wait_until(lambda: text(page, "connection") == "connected", 30, "the page to connect")
    page.execute_script(
        "window.pad = {axes: [0, 0, 0, 0], buttons: Array.from({length: 17}, () => ({value: 0}))};"
        "navigator.getGamepads = () => [window.pad];"
    )

    def tap(button: int) -> None:
        page.execute_script(f"window.pad.buttons[{button}].value = 1")
        time.sleep(0.3)
        page.execute_script(f"window.pad.buttons[{button}].value = 0")
        time.sleep(0.3)

    tap(3)  # Y: take over
    wait_until(lambda: server.source.driver[1] == "pat", 10, "pat to drive")
    before = float(edge.robot.data.qpos[0])
    page.execute_script("window.pad.axes[0] = 1")  # left stick right: the first joint turns
    wait_until(lambda: float(edge.robot.data.qpos[0]) > before + 0.2, 10, "the stick to move the first joint")
    page.execute_script("window.pad.axes[0] = 0")
    wait_until(lambda: edge._episode_step < 250, 30, "an episode with time left")
    episode = edge.episodes
    tap(9)  # Start: success, after its undo window
    wait_until(lambda: page.find_element(By.ID, "pending-label").is_displayed(), 5, "the undo window")
    wait_until(lambda: edge.episodes > episode, 10, "the success to end the episode")
    assert server.last_label == {"episode": episode, "step": server.last_label["step"], "label": "LABEL_SUCCESS"}
    tap(16)  # Home: e-stop
    wait_until(lambda: edge.estop.tripped() == "teleop page: pat", 5, "the e-stop")
