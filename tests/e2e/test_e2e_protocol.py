"""The delivery protocol under SIGKILL: a paced fleet through learner restarts, and edge lives
born and killed while the learner is down. A standalone `user-rl learner` process, edge daemons in
threads or processes, real sockets and files; the buffer's own index judges what arrived."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from tests.e2e.harness import EDGE_SCRIPT, EdgeThreads, learner_status, start_learner, stored
from user_rl.config import build_config
from user_rl.testing.wait import free_port, wait_until

BASE = {
    "robot": {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 50}},
    "fleet": {"num_robots": 2, "control_hz": 40, "batch_transitions": 16, "resend_after_s": 1.0},
    "policy": {"hidden": [32]},
    "algo": {"learning_starts": 200, "batch_size": 64},
    "learner": {"publish_every_updates": 20, "checkpoint_every_s": 1.0, "torch_threads": 1},
    "buffer": {"segment_mb": 0.01},
}


def write_config(tmp_path: Path, fleet: dict) -> tuple[Path, dict]:
    cfg = {
        **BASE,
        "fleet": {**BASE["fleet"], **fleet},
        "learner": {**BASE["learner"], "data_port": free_port(), "weights_port": free_port()},
    }
    path = tmp_path / "protocol.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


def addresses(cfg: dict) -> tuple[str, str]:
    return f"tcp://127.0.0.1:{cfg['learner']['data_port']}", f"tcp://127.0.0.1:{cfg['learner']['weights_port']}"


def test_a_paced_fleet_survives_two_learner_sigkills_and_trains_on(tmp_path: Path) -> None:
    config, cfg_dict = write_config(tmp_path, {"pace_to_learner": True})
    cfg = build_config(cfg_dict)
    assert cfg.fleet.pace_to_learner
    run_dir = tmp_path / "run"
    rng = np.random.default_rng(3)
    with open(tmp_path / "learner.log", "ab") as log:
        proc = start_learner(config, run_dir, log)
        fleet = EdgeThreads(cfg, *addresses(cfg_dict), tmp_path / "spool")
        resumed = []
        try:
            wait_until(lambda: learner_status(run_dir).get("updates", 0) > 50, 120, "training to start")
            for _ in range(2):
                time.sleep(float(rng.uniform(3.0, 6.0)))
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
                proc = start_learner(config, run_dir, log)
                resumed.append(learner_status(run_dir)["resumed_from"]["updates"])
                steps = [e.steps for e in fleet.edges]
                # Training goes on and every paced robot steps on: no stream is left below its credit.
                wait_until(
                    lambda: learner_status(run_dir).get("updates", 0) > resumed[-1] + 50,
                    120,
                    "updates to go on after the restart",
                )
                wait_until(
                    lambda: all(e.steps > s + 100 for e, s in zip(fleet.edges, steps)),
                    120,
                    "every robot to step on after the restart",
                )
            final_updates = learner_status(run_dir).get("updates", 0)
            fleet.stop_and_drain()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    keys, records = stored(run_dir)
    produced = fleet.produced()
    print(
        f"paced chaos: {len(produced)} batches produced, {len(keys)} stored; resumed at updates {resumed}, "
        f"{final_updates} at the end; steps {[e.steps for e in fleet.edges]}"
    )
    assert len(keys) == len(set(keys)), "a batch was stored twice"
    assert set(keys) == produced, f"lost {len(produced - set(keys))}, extra {len(set(keys) - produced)}"
    assert records == sum(e.steps for e in fleet.edges)
    assert final_updates > max(resumed) > 0


def spooled(spool: Path, epoch: int) -> int:
    return len(list(spool.glob(f"{epoch:020d}-*.batch")))


def test_an_edge_life_born_and_killed_during_an_outage_loses_nothing(tmp_path: Path) -> None:
    config, cfg_dict = write_config(tmp_path, {"pace_to_learner": False, "num_robots": 1})
    data, weights = addresses(cfg_dict)
    run_dir, spool_root = tmp_path / "run", tmp_path / "spool"
    spool = spool_root / "mujoco_reach-0"
    edge = [sys.executable, "-c", EDGE_SCRIPT, str(config), data, weights, str(spool_root)]

    def life(max_steps: int) -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen([*edge, str(max_steps)], stdout=subprocess.PIPE, text=True)
        return proc, int(proc.stdout.readline().split()[1])

    with open(tmp_path / "learner.log", "ab") as log:
        learner = start_learner(config, run_dir, log)
        try:
            first, first_epoch = life(10**6)
            wait_until(lambda: learner_status(run_dir)["env_steps"] > 150, 60, "life 1 to stream")
            learner.send_signal(signal.SIGKILL)
            learner.wait(30)
            wait_until(lambda: spooled(spool, first_epoch) >= 3, 30, "life 1 to spool during the outage")
            first.send_signal(signal.SIGKILL)
            first.wait(30)
            second, second_epoch = life(10**6)  # born during the outage: the learner never hears of it
            wait_until(lambda: spooled(spool, second_epoch) >= 5, 60, "life 2 to spool")
            second.send_signal(signal.SIGKILL)
            second.wait(30)
            left = {first_epoch: spooled(spool, first_epoch), second_epoch: spooled(spool, second_epoch)}
            learner = start_learner(config, run_dir, log)
            third, third_epoch = life(120)
            out, _ = third.communicate(timeout=180)
            assert third.returncode == 0, out
            _, steps, last_seq = out.split()
            wait_until(lambda: not list(spool.glob("*.batch")), 60, "every spooled batch to arrive")
            status = learner_status(run_dir)
        finally:
            learner.send_signal(signal.SIGTERM)
            learner.wait(120)
    keys, _ = stored(run_dir)
    by_epoch = {e: sorted(s for _, ep, s in keys if ep == e) for e in (first_epoch, second_epoch, third_epoch)}
    print(
        f"outage lives: epochs {list(by_epoch)}, stored seqs per life {[len(v) for v in by_epoch.values()]}, "
        f"spooled at the restart {left}"
    )
    assert first_epoch < second_epoch < third_epoch
    assert len(keys) == len(set(keys)), "a batch was stored twice"
    for epoch, seqs in by_epoch.items():  # every life's stream is whole: 1..last, each once
        assert seqs == list(range(1, len(seqs) + 1)), (epoch, seqs[:5], len(seqs))
    assert len(by_epoch[second_epoch]) >= left[second_epoch] >= 5  # all of life 2 arrived
    assert len(by_epoch[third_epoch]) == int(last_seq) and int(steps) == 120
    assert status["rejected"] == {}  # no epoch was unknown to the learner
