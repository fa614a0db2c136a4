"""A kill schedule of its own (issue 29): the learner SIGKILLed three times, an edge killed while the
learner is down, one edge life born and killed during that outage, the last life detaching at the
end. Nothing is lost or stored twice, no episode is left open, no complete episode is marked cut,
only the episodes the killed lives died in are, and every episode's length in the index equals
the step records its segments hold. Real processes, sockets and files."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from tests.e2e.harness import start_learner
from tests.e2e.test_e2e_delivery import BASE
from user_rl.cloud.buffer.index import BufferIndex
from user_rl.cloud.buffer.inspect import inspect_buffer
from user_rl.testing.wait import free_port, wait_until

EPISODE_STEPS = 50
# An edge in its own process: prints its epoch, runs, then delivers everything and detaches.
EDGE = """
import sys, yaml
from user_rl.config import build_config
from user_rl.edge.factory import make_edge
cfg = build_config(yaml.safe_load(open(sys.argv[1])))
edge = make_edge(cfg, 0, sys.argv[2], sys.argv[3], sys.argv[4])
print("epoch", edge.link.epoch, flush=True)
edge.run(max_steps=int(sys.argv[5]))
print("done", edge.steps, edge.link.seq, edge.detach(90), flush=True)
"""


def spool_files(spool: Path) -> list[Path]:
    return list(spool.rglob("*.batch"))


def test_kill_schedule_loses_nothing_and_cuts_only_the_episodes_lives_died_in(tmp_path: Path) -> None:
    data_port, weights_port = free_port(), free_port()
    cfg = {
        **BASE,
        "fleet": {**BASE["fleet"], "num_robots": 1},
        "algo": {"learning_starts": 10**6},  # the data path is under test, not learning: no updates on 2 cores
        "learner": {**BASE["learner"], "data_port": data_port, "weights_port": weights_port},
    }
    config = tmp_path / "kill.yaml"
    config.write_text(yaml.safe_dump(cfg))
    run_dir, spool = tmp_path / "run", tmp_path / "spool"
    args = [
        sys.executable,
        "-c",
        EDGE,
        str(config),
        f"tcp://127.0.0.1:{data_port}",
        f"tcp://127.0.0.1:{weights_port}",
        str(spool),
    ]
    rng = np.random.default_rng(29)
    lives: list[subprocess.Popen] = []

    def life(steps: int) -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen([*args, str(steps)], stdout=subprocess.PIPE, text=True)
        lives.append(proc)
        return proc, int(proc.stdout.readline().split()[1])

    def kill(proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    def killed_mid_episode(proc: subprocess.Popen, run_s: float) -> None:
        time.sleep(run_s)
        kill(proc)

    epochs = []
    with open(tmp_path / "learner.log", "ab") as log:
        learner = start_learner(config, run_dir, log)
        try:
            first, epoch = life(10**6)
            epochs.append(epoch)
            time.sleep(float(rng.uniform(3.0, 4.0)))
            kill(learner)  # 1st learner kill
            killed_mid_episode(first, float(rng.uniform(1.0, 2.0)))  # an edge dies while the learner is down
            born, epoch = life(10**6)  # a life born and killed during the outage
            epochs.append(epoch)
            killed_mid_episode(born, float(rng.uniform(1.5, 2.5)))
            last, epoch = life(1230)  # runs to the end (31 s at 40 Hz), mid-episode
            epochs.append(epoch)
            time.sleep(1.0)
            learner = start_learner(config, run_dir, log)
            for _ in range(2):  # 2nd and 3rd kills, with the last life streaming
                time.sleep(float(rng.uniform(2.0, 4.0)))
                kill(learner)
                time.sleep(float(rng.uniform(0.5, 1.5)))
                learner = start_learner(config, run_dir, log)
            out, _ = last.communicate(timeout=150)
            done = out.split()
            assert done[0] == "done" and done[-1] == "True", out
            wait_until(lambda: not spool_files(spool), 30, "every spooled batch to be acked")
        finally:
            for proc in lives:
                if proc.poll() is None:
                    proc.kill()
            learner.send_signal(signal.SIGTERM)
            learner.wait(120)
    assert epochs == sorted(epochs) and len(set(epochs)) == 3

    buffer_dir = run_dir / "buffer"
    index = BufferIndex(buffer_dir / "index.sqlite", read_only=True)
    try:
        keys, lost = index.batch_keys(), index.lost_keys()
        epoch_of = {s.id: s.epoch for s in index.streams()}
        episodes = index.episodes()
    finally:
        index.close()
    assert len(keys) == len(set(keys)), "a batch was stored twice"
    assert lost == [], f"batches lost: {lost}"
    for epoch in epochs:  # every seq of every life, from 1 to its last, once (spools are empty: all acked)
        seqs = sorted(q for _, e, q in keys if e == epoch)
        assert seqs == list(range(1, len(seqs) + 1)), f"epoch {epoch}: seqs {seqs[:5]}..{seqs[-5:]} have a hole"
    assert sorted(epoch_of.values()) == epochs, "a stream was made for an epoch without data"

    summary = {
        e: [(ep.episode, ep.length, ep.end_reason) for ep in episodes if epoch_of[ep.stream] == e] for e in epochs
    }
    for epoch, eps in summary.items():
        *before, final = eps
        # every episode before a life's last one is complete and ends by its time limit
        assert all(length == EPISODE_STEPS and reason == "" for _, length, reason in before), (epoch, eps)
        if epoch == epochs[-1]:
            assert final[2] in ("", "detached"), (epoch, final)  # the last life detached at the end
        else:  # the killed lives: only the episode each died in is cut, and it is not complete
            assert final[2] in ("", "edge_restart") and (final[2] == "") == (final[1] == EPISODE_STEPS), (epoch, final)
    report = inspect_buffer(buffer_dir)
    assert report["ok"] and report["episode_length_mismatches"] == [], report["problems"]
    assert report["episodes"]["open"] == 0, "an episode was left open"
    print(
        f"kill schedule: epochs {epochs}, {len(keys)} batches, {report['records']} records; episodes per "
        f"life {[len(eps) for eps in summary.values()]}, last of each {[eps[-1] for eps in summary.values()]}"
    )
