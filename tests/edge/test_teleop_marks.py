"""Labels belong to the episode they were given in (issue 29, point 6): a mark names the episode and
step the page showed; one for an episode that has ended is refused on the page and labels nothing
(never the next episode); the page shows the episode's step count and its limit. Real headless
Chromium, a real learner and edge daemon (MuJoCo reach, 40-step episodes at 20 Hz)."""

from __future__ import annotations

import re
import threading

from selenium.webdriver.common.by import By

from tests.edge.test_teleop_browser import browser, text  # noqa: F401  (a fixture)
from tests.support.teleop import teleop_fleet
from user_rl.edge.operator import OperatorRequests
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb

HZ = 20.0
LIMIT = 40


def test_a_mark_labels_the_episode_it_was_made_in_or_is_refused_never_the_next(running, browser) -> None:  # noqa: F811
    _, (edge,) = running(
        teleop_fleet(1, HZ, "teleop.frame_hz=2", "teleop.view_size=32"),
        {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": LIMIT, "control_hz": HZ}},
    )
    records: list = []
    lock = threading.Lock()

    def watch(record) -> None:
        with lock:
            records.append((record.episode, record.step, record.label, record.ended))

    edge.step_watchers.append(watch)
    alice = browser()
    alice.get(edge.teleop.url + "&name=alice")
    wait_until(lambda: text(alice, "connection") == "connected", 30, "the page to connect")
    # The page shows how far the episode is and where it ends.
    wait_until(lambda: re.fullmatch(rf"\d+ of {LIMIT}(: ended)?", text(alice, "episode-steps")), 10, "steps of limit")

    # Episode E ends by its time limit; a mark for it sent afterwards (a click as it ended) is refused.
    ended = edge.episodes
    wait_until(lambda: edge.episodes > ended and edge._episode_step >= 2, 10, "episode E to end")
    alice.execute_script(
        f"window.teleop.ws.send(JSON.stringify({{type: 'mark', success: true, episode: {ended}, step: {LIMIT - 1}}}));"
    )
    wait_until(lambda: "had already ended" in text(alice, "message"), 10, "the refusal on the page")
    assert f"episode {ended}" in text(alice, "message")
    following = ended + 1
    wait_until(lambda: edge.episodes > following, 10, "the next episode to run to its end")
    with lock:
        nxt = [r for r in records if r[0] == following]
    # Not cut short by it and not labelled by it: the only label is the sim's own, on its last row (step LIMIT - 1).
    assert [(step, end) for _, step, label, end in nxt if label != pb.LABEL_NONE or end] == [(LIMIT - 1, True)], nxt

    # A mark clicked during an episode labels that episode (its next step ends it), and the page says so.
    wait_until(lambda: 5 <= edge._episode_step <= LIMIT - 10, 10, "the middle of an episode")
    episode = edge.episodes
    alice.find_element(By.ID, "mark-failure").click()
    wait_until(lambda: f"episode {episode} marked failure" in text(alice, "message"), 10, "the mark applied")
    with lock:
        marked = [(step, label, end) for e, step, label, end in records if e == episode and (label or end)]
    assert len(marked) == 1 and marked[0][1:] == (pb.LABEL_FAILURE, True) and marked[0][0] < LIMIT - 1, marked
    assert edge.status()["refused_requests"] == 1


def test_a_request_taken_after_its_episode_ended_is_refused_and_told() -> None:
    """The loop's own check (a mark queued as an e-stop, a hold or a reset ends its episode)."""
    requests, told = OperatorRequests(), []
    requests.mark(True, episode=3, step=17, by="alice", done=lambda applied, message: told.append((applied, message)))
    assert requests.take_label(4, 0) == pb.LABEL_NONE
    assert told[-1][0] is False and "episode 3 at its step 17, which had already ended" in told[-1][1]
    requests.reset(episode=4, step=2, by="alice", done=lambda applied, message: told.append((applied, message)))
    assert requests.take_reset(5) == "" and told[-1][0] is False and requests.refused == 2
    requests.mark(False, episode=5, step=3, done=lambda applied, message: told.append((applied, message)))
    assert requests.take_label(5, 4) == pb.LABEL_FAILURE and told[-1] == (
        True,
        "episode 5 marked failure at its step 4",
    )
    requests.mark(True)  # a source on the loop's own thread: the episode in progress
    assert requests.take_label(6, 0) == pb.LABEL_SUCCESS
