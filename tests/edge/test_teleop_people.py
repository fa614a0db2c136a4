"""Who did what, by person name (issue 33, part 6), from the teleop page to the buffer: two people
take turns at the real teleop server over real websockets, each under the name their page gave,
driving a position arm and marking their episode; the edge daemon streams to the learner's real
ingest, and `buffer inspect` on the buffer files says who drove which rows and who labelled which
episode, by name."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import aiohttp
import zmq

from tests.edge.test_teleop_takeover import HZ, START, ServoArm
from user_rl.cloud.buffer.episodes import read_episodes
from user_rl.cloud.buffer.inspect import inspect_buffer
from user_rl.cloud.ingest import Ingest
from user_rl.config_sections import TeleopConfig
from user_rl.edge.daemon import EdgeDaemon, EdgeSettings
from user_rl.edge.intervention import InterventionMux
from user_rl.edge.teleop import make_source, start_server
from user_rl.hal.lerobot.robot import LeRobotRobot
from user_rl.policies import make_actor
from user_rl.robots.safety import SafetySettings
from user_rl.testing.wait import serving, wait_until
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import ACTOR_PERSON, LABEL_PERSON

LONG_NAME = "Bartholomew " + "x" * 60  # a page may send any name: the server keeps 40 characters


async def take_a_turn(url: str, name: str, success: bool) -> dict:
    """As a page does: say who you are, take over, hold j1 + for a while, mark the episode the page
    shows, and hand back. Returns the server's answer to the mark."""
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"type": "hello", "name": name})
        await ws.send_json({"type": "take_over"})
        state: dict = {}
        for _ in range(6):
            await ws.send_json({"type": "command", "id": 1, "action": [1.0, 0.0, 0.0]})
            state = await latest_state(ws, state)
            await asyncio.sleep(0.1)
        while not state.get("you_drive") or state.get("teleop_driver") != name[:40]:
            state = await latest_state(ws, state)
        await ws.send_json({"type": "mark", "success": success, "episode": state["episode"], "step": state["step"]})
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            message = await ws.receive(timeout=deadline - time.monotonic())
            data = json.loads(message.data) if message.type == aiohttp.WSMsgType.TEXT else {}
            if data.get("type") in ("ok", "error") and data.get("for", "mark") == "mark":
                await ws.send_json({"type": "hand_back"})
                return data
        raise AssertionError("no answer to the mark")


async def latest_state(ws, state: dict) -> dict:
    """The newest state the server sent (waiting for one if none came since)."""
    while True:
        message = await ws.receive(timeout=5.0)
        if message.type != aiohttp.WSMsgType.TEXT:
            continue
        data = json.loads(message.data)
        if data.get("type") == "state":
            return data


def test_rows_and_labels_carry_the_names_people_gave_on_the_page(tmp_path) -> None:
    robot = LeRobotRobot(
        ServoArm(), robot_id="arm-0", control_hz=HZ, episode_steps=100_000, reset="pose", reset_pose=START, reset_s=0.0
    )
    teleop = TeleopConfig(enabled=True, speed=0.5)
    source = make_source(robot, teleop, None, HZ)
    context = zmq.Context()
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer")
    actor = make_actor("mlp", robot.observation_space, robot.action_space, hidden=[16])
    edge = EdgeDaemon(
        robot,
        actor,
        ingest.endpoint,
        "tcp://127.0.0.1:1",
        EdgeSettings(control_hz=HZ, safety=SafetySettings()),
        context,
        interventions=InterventionMux([source]),
    )  # no weights: the policy acts randomly (warm-up) between the people's turns
    seen: list[tuple[int, int, int, str, int]] = []  # (episode, step, actor, person, label) per step

    def watch(record) -> None:
        seen.append((record.episode, record.step, record.actor, record.person, record.label))

    edge.step_watchers.append(watch)
    server = start_server(edge, source, teleop)
    loop = threading.Thread(target=edge.run, daemon=True)
    url = server.url.replace("/?", "/ws?")
    try:
        with serving(lambda: ingest.poll(50)) as crashed:
            loop.start()
            alice = asyncio.run(take_a_turn(url, "alice", success=True))
            wait_until(lambda: seen and seen[-1][2] != pb.ACTOR_HUMAN, 10, "alice's hand-back")
            other = asyncio.run(take_a_turn(url, LONG_NAME, success=False))
            time.sleep(0.3)  # the policy's steps after the hand-back
            edge.stop()
            loop.join(10)
            assert edge.drain(20), "the learner acknowledged every batch"
        assert not crashed, crashed
    finally:
        edge.stop()
        edge.close()
        ingest.close()  # seals the buffer
        context.term()
    assert alice["type"] == "ok" and "marked success" in alice["message"], alice
    assert other["type"] == "ok" and "marked failure" in other["message"], other
    bart = LONG_NAME[:40]
    driven = {name: sum(1 for *_, a, p, _ in seen if a == pb.ACTOR_HUMAN and p == name) for name in ("alice", bart)}
    assert driven["alice"] >= 5 and driven[bart] >= 5, driven
    assert all(p in ("alice", bart) for *_, a, p, _ in seen if a == pb.ACTOR_HUMAN)
    assert not any(p for *_, a, p, _ in seen if a != pb.ACTOR_HUMAN)  # the policy's steps name nobody

    who = inspect_buffer(tmp_path / "buffer")["who"]
    assert who["records"] == len(seen)
    assert {name: (p["acted"], p["labelled"]) for name, p in who["people"].items()} == {
        "alice": (driven["alice"], {"success": 1, "failure": 0}),
        bart: (driven[bart], {"success": 0, "failure": 1}),
    }
    assert who["unnamed"]["acted"] == 0 and who["labelled"]["person"] == {"success": 1, "failure": 1}
    print(f"\n{len(seen)} steps: alice drove {driven['alice']}, {bart!r} {driven[bart]}; each marked their episode")
    # Each labelled episode: its last row names who marked it, and each row who drove it.
    episodes = {e.number: e for e in read_episodes(tmp_path / "buffer")}
    for number, name in ((seen[0][0], "alice"), (seen[0][0] + 1, bart)):
        episode = episodes[number]
        names = [episode.people.get(int(i), "") for i in episode.steps[ACTOR_PERSON]]
        mine = [e for e in seen if e[0] == number]
        assert names == [p for *_, p, _ in mine]
        assert episode.people[int(episode.steps[LABEL_PERSON][-1])] == name
        assert not episode.steps[LABEL_PERSON][:-1].any()
