"""Lossless delivery end to end: a learner killed with SIGKILL, a dropped uplink, a capped
uplink with two cameras per robot, an edge killed mid-episode. Real processes, real sockets,
real files; the buffer's own index is the judge of what arrived."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.e2e.harness import EDGE_SCRIPT, EdgeThreads, learner_status, start_learner, stored
from user_rl.cloud.buffer.index import BufferIndex
from user_rl.cloud.buffer.inspect import inspect_buffer
from user_rl.cloud.learner import Learner
from user_rl.config import build_config
from user_rl.testing.fault_proxy import FaultProxy
from user_rl.testing.wait import free_port, wait_until

BASE = {
    "robot": {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 50}},
    "fleet": {
        "num_robots": 2,
        "pace_to_learner": False,
        "control_hz": 40,
        "batch_transitions": 16,
        "resend_after_s": 1.0,
    },
    "policy": {"hidden": [32]},
    "algo": {"learning_starts": 200, "batch_size": 64},
    "learner": {"publish_every_updates": 20, "checkpoint_every_s": 1.0, "torch_threads": 1},
    "buffer": {"segment_mb": 0.01},
}


def test_sigkilled_learner_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    data_port, weights_port = free_port(), free_port()
    cfg_dict = {**BASE, "learner": {**BASE["learner"], "data_port": data_port, "weights_port": weights_port}}
    config = tmp_path / "chaos.yaml"
    config.write_text(yaml.safe_dump(cfg_dict))
    cfg = build_config(cfg_dict)
    run_dir = tmp_path / "run"
    rng = np.random.default_rng(7)
    with open(tmp_path / "learner.log", "ab") as log:
        proc = start_learner(config, run_dir, log)
        fleet = EdgeThreads(cfg, f"tcp://127.0.0.1:{data_port}", f"tcp://127.0.0.1:{weights_port}", tmp_path / "spool")
        resumed, before_kill = [], []
        try:
            for _ in range(3):
                time.sleep(float(rng.uniform(5.0, 8.0)))
                before_kill.append(learner_status(run_dir))
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
                steps_while_down = sum(e.steps for e in fleet.edges)
                time.sleep(1.0)
                assert sum(e.steps for e in fleet.edges) > steps_while_down  # robots act on while it is down
                proc = start_learner(config, run_dir, log)
                resumed.append(learner_status(run_dir)["resumed_from"])
            time.sleep(5.0)
            fleet.stop_and_drain()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    final = learner_status(run_dir)
    keys, records = stored(run_dir)
    produced = fleet.produced()
    print(
        f"chaos: {len(produced)} batches produced, {len(keys)} stored ({len(set(keys))} distinct), "
        f"{records} records for {sum(e.steps for e in fleet.edges)} steps; resumed from {resumed}; "
        f"final updates {final['updates']}, version {final['policy_version']}"
    )
    assert len(keys) == len(set(keys)), "a batch was stored twice"
    assert set(keys) == produced, f"lost {len(produced - set(keys))}, extra {len(set(keys) - produced)}"
    assert records == sum(e.steps for e in fleet.edges)  # every step stored exactly once
    # Training continued from the checkpoints: each restart resumed recent updates and versions.
    assert all(r is not None and r["updates"] > 0 for r in resumed[1:]), resumed
    resumed_updates = [r["updates"] for r in resumed if r]
    assert resumed_updates == sorted(resumed_updates), "a restart went back to an older checkpoint"
    assert final["updates"] > max(resumed_updates)
    assert final["policy_version"] > max(r["policy_version"] for r in resumed if r)
    assert inspect_buffer(run_dir / "buffer")["corrupt"] == []
    # Reconnecting edges say hello before anything else: no learner rejected a single message.
    assert [s["rejected"] for s in [*before_kill, final]] == [{}] * 4
    # Its log tells the operator what happened: each restart resumed, and progress went on.
    log_text = (tmp_path / "learner.log").read_text()
    assert log_text.count("resumed from {") == 3 and log_text.count("fresh run") == 1
    assert " updates " in log_text.splitlines()[-2] and "learner stopped" in log_text.splitlines()[-1]


# -- in-process learner helpers --------------------------------------------------------------------
@pytest.fixture
def learner_factory(tmp_path: Path):
    started = []

    def start(cfg) -> Learner:
        learner = Learner(cfg, tmp_path / "run")
        thread = threading.Thread(target=learner.run, daemon=True)
        thread.start()
        started.append((learner, thread))
        return learner

    yield start
    for learner, thread in started:
        learner.stop()
        thread.join(30)
        learner.close()


def test_twenty_second_link_drop_spools_and_catches_up(tmp_path: Path, learner_factory) -> None:
    cfg = build_config(BASE)
    learner = learner_factory(cfg)
    with FaultProxy(learner.addresses["data"]) as proxy:
        fleet = EdgeThreads(cfg, proxy.address, learner.addresses["weights"], tmp_path / "spool")
        wait_until(lambda: learner.env_steps > 200, 60, "data to flow")
        proxy.drop(20.0)
        during = sum(e.steps for e in fleet.edges)
        time.sleep(20.0)
        acted = sum(e.steps for e in fleet.edges) - during
        backlog = sum(e.link.unacked for e in fleet.edges)
        print(f"link drop: {acted} steps taken and {backlog} batches spooled during the 20 s outage")
        assert acted >= 0.8 * 20 * 40 * 2, "the control loops stalled while the link was down"
        assert backlog >= 40, "the edges did not spool while the link was down"
        wait_until(lambda: sum(e.link.unacked for e in fleet.edges) < 4, 60, "the edges to catch up")
        fleet.stop_and_drain()
    learner.stop()
    time.sleep(0.5)
    learner.buffer.close()  # sealed: the index holds everything (the learner owns its buffer)
    keys, records = stored(tmp_path / "run")
    assert set(keys) == fleet.produced() and len(keys) == len(set(keys))
    assert records == sum(e.steps for e in fleet.edges)


UPLINK_WINDOW_S = 60  # its second half (30 s, six samples) shows whether the backlog grows


def test_capped_uplink_carries_four_two_camera_robots_without_backlog(tmp_path: Path, learner_factory) -> None:
    cfg = build_config(
        {
            **BASE,
            "robot": {
                "type": "mujoco_reach",
                "options": {"obs_mode": "image", "image_size": 128, "extra_cameras": ["top"], "episode_steps": 50},
            },
            "fleet": {
                **BASE["fleet"],
                "num_robots": 4,
                "control_hz": 10,
                "batch_transitions": 10,
                "compression": {
                    "image": {"format": "jpeg", "quality": 90},
                    "image_top": {"format": "jpeg", "quality": 90},
                },
            },
            "algo": {"learning_starts": 10**6},  # the link is under test, not learning: no updates on 2 cores
        }
    )
    learner = learner_factory(cfg)
    with (
        FaultProxy(learner.addresses["data"], delay_s=0.05, bandwidth_bps=20e6) as up,
        FaultProxy(learner.addresses["weights"], delay_s=0.05, bandwidth_bps=20e6) as down,
    ):
        fleet = EdgeThreads(cfg, up.address, down.address, tmp_path / "spool")
        started, samples = time.monotonic(), []
        while time.monotonic() - started < UPLINK_WINDOW_S:
            time.sleep(5.0)
            samples.append((time.monotonic() - started, sum(e.link.unacked for e in fleet.edges), up.bytes_up))
        steps = [e.steps for e in fleet.edges]
        fleet.stop_and_drain()
    elapsed = samples[-1][0]
    uplink_mbit = samples[-1][2] * 8 / elapsed / 1e6
    second_half = [b for t, b, _ in samples if t > UPLINK_WINDOW_S / 2]  # past the start-up burst
    print(f"backlog samples {[b for _, b, _ in samples]}, uplink {uplink_mbit:.1f} Mbit/s, steps {steps}")
    assert min(steps) >= 0.9 * 10 * UPLINK_WINDOW_S, "robots did not keep 10 Hz"
    # A link too slow for the load grows its backlog steadily (at 80% of the load, by ~0.8 batches a
    # second: ~24 by the end). One sample higher while a loaded box starved the learner is not growth
    # (a CI run beside a benchmark saw [.., 3, 13, 2, 1, 4]).
    assert second_half[-1] <= 8 and sum(second_half) / len(second_half) <= 8, "the backlog grew"
    assert uplink_mbit < 20
    learner.stop()
    time.sleep(0.5)
    status = learner.status()
    assert status["rejected"] == {}
    learner.buffer.close()  # sealed: the index holds everything (the learner owns its buffer)
    keys, records = stored(tmp_path / "run")
    assert set(keys) == fleet.produced() and len(keys) == len(set(keys))
    assert records == sum(e.steps for e in fleet.edges)


# -- an edge killed mid-episode ----------------------------------------------------------------------
def test_edge_killed_mid_episode_leaves_a_truncated_episode_and_clean_data(tmp_path: Path, learner_factory) -> None:
    cfg_dict = {**BASE, "fleet": {**BASE["fleet"], "num_robots": 1}}
    cfg = build_config(cfg_dict)
    config = tmp_path / "edge.yaml"
    config.write_text(yaml.safe_dump(cfg_dict))
    learner = learner_factory(cfg)
    args = [
        sys.executable,
        "-c",
        EDGE_SCRIPT,
        str(config),
        learner.addresses["data"],
        learner.addresses["weights"],
        str(tmp_path / "spool"),
    ]
    first = subprocess.Popen([*args, "100000"], stdout=subprocess.PIPE, text=True)
    first_epoch = int(first.stdout.readline().split()[1])
    wait_until(lambda: learner.env_steps > 150, 60, "the first edge to stream")
    while learner.env_steps % 50 in (0, 49):  # make sure the kill lands inside an episode
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    second = subprocess.run([*args, "120"], capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    wait_until(lambda: not list((tmp_path / "spool").rglob("*.batch")), 30, "every spooled batch to arrive")
    learner.stop()
    time.sleep(0.5)
    learner.buffer.close()  # sealed: the index holds everything (the learner owns its buffer)
    index = BufferIndex(tmp_path / "run" / "buffer" / "index.sqlite", read_only=True)
    episodes = index.episodes()
    streams = {s.id: s for s in index.streams()}
    index.close()
    old = [e for e in episodes if streams[e.stream].epoch == first_epoch]
    assert (old[-1].status, old[-1].end_reason) == ("truncated", "edge_restart")  # the partial episode
    assert 0 < old[-1].length < 50
    assert all(e.status == "truncated" and e.end_reason == "" and e.length == 50 for e in old[:-1])
    report = inspect_buffer(tmp_path / "run" / "buffer")
    assert report["corrupt"] == [] and report["episodes"]["cut_short"] == 1
