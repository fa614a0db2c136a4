"""The learner service on real sockets and files: it names its device, takes its spaces from the
config (not from whoever says hello first), never reissues a policy version after a crash, and a
background thread that fails shows in the status and the progress line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml
import zmq

from tests.support.messages import first_steps, hello_envelope
from user_rl.cloud.learner import Learner, credit_increment
from user_rl.cloud.threads import GuardedThread
from user_rl.cloud.version_lease import LEASE_FILE, VersionLease
from user_rl.config import build_config
from user_rl.edge.factory import make_edge
from user_rl.edge.weights import WeightReceiver
from user_rl.hal.registry import robot_spaces
from user_rl.launch.placement import actor_options, check_cluster, learner_demand, learner_wants_gpu
from user_rl.launch.training import updates_caught_up
from user_rl.progress import ProgressPrinter
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import decode, encode, envelope

REACH = {
    "robot": {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 50}},
    "fleet": {"num_robots": 1, "pace_to_learner": False},
    "policy": {"hidden": [32]},
    "algo": {"learning_starts": 100, "batch_size": 32},
    "learner": {"torch_threads": 1},
}


class Serving:
    """Learners of a config, each with its update loop in a thread (kept: a test reads why it ended)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.loops: dict[int, GuardedThread] = {}
        self.learners: list[Learner] = []

    def __call__(self, cfg_dict: dict, run_dir: Path | None = None) -> Learner:
        learner = Learner(build_config(cfg_dict), run_dir or self.tmp_path / "run")
        self.loops[id(learner)] = loop = GuardedThread("update-loop", learner.run)
        loop.start()
        self.learners.append(learner)
        return learner

    def loop_of(self, learner: Learner) -> GuardedThread:
        return self.loops[id(learner)]

    def close(self) -> None:
        for learner in self.learners:
            learner.stop()
            self.loops[id(learner)].join(30)
            learner.close()


@pytest.fixture
def serving_learner(tmp_path: Path):
    serving = Serving(tmp_path)
    yield serving
    serving.close()


# -- the device ------------------------------------------------------------------------------
def test_auto_asks_ray_for_a_gpu_exactly_when_the_cluster_has_one() -> None:
    assert learner_wants_gpu("auto", {"CPU": 16.0, "GPU": 1.0})
    assert not learner_wants_gpu("auto", {"CPU": 16.0})
    assert learner_wants_gpu("cuda", {}) and not learner_wants_gpu("cpu", {"GPU": 8.0})
    cfg = build_config({"learner": {"device": "auto"}})
    on_gpu = learner_demand(cfg, {"CPU": 16.0, "GPU": 2.0})
    assert on_gpu.resources == {"GPU": 1.0} and actor_options(on_gpu)["num_gpus"] == 1.0
    on_cpu = learner_demand(cfg, {"CPU": 16.0})
    assert on_cpu.resources == {} and "num_gpus" not in actor_options(on_cpu)
    # The launch check counts the live nodes' GPUs the same way: a GPU node makes `auto` ask for it.
    gpu_node = {"NodeID": "a", "Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0, "sim:mujoco_reach": 8.0}}
    check_cluster(cfg, [gpu_node])


def test_the_learner_names_its_device_in_the_status_and_its_first_line(tmp_path: Path) -> None:
    learner = Learner(build_config(REACH), tmp_path / "direct")
    try:
        expected = f"cpu ({torch.get_num_threads()} threads)"
        assert learner.device_name == expected and learner.status()["device"] == expected  # before any loop runs
    finally:
        learner.close()
    config = tmp_path / "reach.yaml"
    config.write_text(yaml.safe_dump(REACH))
    proc = subprocess.Popen(
        [sys.executable, "-m", "user_rl.cli", "learner", str(config), "--run-dir", str(tmp_path / "cli")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        first = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    print(first.strip())
    assert "trains on cpu (1 threads)" in first and "fresh run" in first


# -- the fleet's spaces come from the config ---------------------------------------------------
def hello(robot_id: str, spaces: tuple, epoch: int = 1) -> list[bytes]:
    return encode(hello_envelope(robot_id, epoch, *spaces, model="mujoco_reach"))


def test_a_strangers_first_hello_cannot_take_the_fleets_place(serving_learner) -> None:
    learner = serving_learner(REACH)  # the config's robot: the 3-dof arm
    own = robot_spaces("mujoco_reach", build_config(REACH).robot_options(0))
    stranger = robot_spaces("mujoco_reach", {"arm": "4dof", "obs_mode": "state"})
    assert own[1].shape != stranger[1].shape
    context = zmq.Context()
    peer = context.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.connect(learner.addresses["data"])
    try:

        def reply():
            assert peer.poll(10_000), "no reply from the learner"
            return decode(peer.recv_multipart())

        peer.send_multipart(hello("stranger-0", stranger))  # first to speak, with other spaces
        refused = reply()
        assert refused.kind == "reject" and refused.body.reason.startswith("spaces_mismatch"), refused.body
        peer.send_multipart(hello("mujoco_reach-0", own))
        welcome = reply()
        assert welcome.kind == "ack" and welcome.body.stream_epoch == 1, welcome.kind
        wait_until(lambda: "mujoco_reach-0" in learner.status()["robots"], 10, "the status to show the robot")
        status = learner.status()
        assert "stranger-0" not in status["robots"] and status["rejected"] == {"spaces_mismatch": 1}
    finally:
        peer.close(0)
        context.term()


def test_a_full_disk_stops_the_learner_taking_data_and_shows_in_the_status_and_progress_line(
    tmp_path: Path, serving_learner, monkeypatch
) -> None:
    """The ingest's storage failure (tests/cloud/test_cloud_ingest_failure.py) as a user sees it."""
    import errno
    import os

    learner = serving_learner(REACH)
    spaces = robot_spaces("mujoco_reach", build_config(REACH).robot_options(0))

    def disk_full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("user_rl.cloud.buffer.segment.os.pwrite", disk_full)
    context = zmq.Context()
    peer = context.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.connect(learner.addresses["data"])
    try:
        peer.send_multipart(hello("mujoco_reach-0", spaces))
        assert peer.poll(10_000) and decode(peer.recv_multipart()).kind == "ack"
        count, columns = first_steps(
            *spaces, 4, lambda _: spaces[0].sample(), lambda _: spaces[1].sample(), actor=pb.ACTOR_SCRIPTED
        )
        peer.send_multipart(
            encode(envelope("mujoco_reach-0", batch=pb.TransitionBatch(stream_epoch=1, seq=1, count=count)), columns)
        )
        # The learner may push credit and new policy versions (acks of nothing new) meanwhile: no
        # ack covers the batch the disk refused, and the reply to it is a reject.
        while True:
            assert peer.poll(10_000), "no reply from the learner"
            refused = decode(peer.recv_multipart())
            if refused.kind != "ack":
                break
            assert refused.body.seq < 1, f"an ack covers batch {refused.body.seq}, which the full disk refused"
        assert refused.kind == "reject" and refused.body.reason.startswith("learner_storage_failed"), refused.kind
        wait_until(lambda: "storage" in learner.status()["errors"], 10, "the storage failure in the status")
    finally:
        peer.close(0)
        context.term()
    status = learner.status()
    assert "ENOSPC" in status["errors"]["storage"] and status["failure"] == status["errors"]["storage"]
    lines: list[str] = []
    ProgressPrinter(tmp_path / "metrics.jsonl", lines.append, every_s=0.0).progress(1.0, status)
    print("\n".join(lines))
    assert any(line.startswith("ERROR storage: ") and "ENOSPC" in line for line in lines)


# -- policy versions are never reissued ----------------------------------------------------------
CRASHING_LEARNER = textwrap.dedent("""
    import sys, threading, yaml
    from pathlib import Path
    from user_rl.cloud.learner import Learner
    from user_rl.config import build_config
    learner = Learner(build_config(yaml.safe_load(open(sys.argv[1]))), Path(sys.argv[2]))
    threading.Thread(target=learner.run, daemon=True).start()
    first = learner.pause()                      # publishes the actor as a version
    learner.checkpoint_now()                     # the checkpoint holds that one
    learner.resume()
    versions = [first]
    for _ in range(3):                           # published after the checkpoint: lost to a crash
        versions.append(learner.pause())
        learner.resume()
    print(" ".join(map(str, versions)), flush=True)
    threading.Event().wait()                     # until SIGKILL
""")


def test_a_crashed_learner_never_publishes_a_version_number_again(tmp_path: Path, serving_learner) -> None:
    config = tmp_path / "reach.yaml"
    config.write_text(yaml.safe_dump(REACH))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_LEARNER, str(config), str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGKILL)  # a crash: nothing is closed, no final checkpoint
        proc.wait(30)
    before_crash = [int(v) for v in line.split()]
    assert len(before_crash) == 4 and before_crash == sorted(set(before_crash)), line

    learner = serving_learner(REACH, run_dir)  # resumes from the checkpoint taken at the first version
    assert learner.resumed_from["policy_version"] == before_crash[0]
    context = zmq.Context()
    receiver = WeightReceiver(context, learner.addresses["weights"])
    try:
        served, _ = receiver.wait_for(0)
        after = learner.pause()
    finally:
        receiver.close()
        context.term()
    print(
        f"published before the crash {before_crash}; after it: served {served}, next {after}; "
        f"lease file {(run_dir / LEASE_FILE).read_text().strip()}"
    )
    assert served > max(before_crash) and after > served


def test_a_clean_stop_gives_back_unused_versions_and_a_crash_skips_them(tmp_path: Path) -> None:
    lease = VersionLease(tmp_path)
    assert [lease.next() for _ in range(3)] == [1, 2, 3]
    lease.release()  # a clean stop: the next start goes on from 4
    crashed = VersionLease(tmp_path)
    assert crashed.next() == 4  # reserves 4..103 on disk, then the process dies without releasing
    assert VersionLease(tmp_path, at_least=2).next() == 104


# -- failing threads are reported --------------------------------------------------------------
def test_a_failing_checkpointer_and_a_dead_sampler_show_in_the_status_and_progress_line(
    tmp_path: Path, serving_learner, monkeypatch
) -> None:
    def broken_disk(path, payload):
        raise RuntimeError("the checkpoint disk is on fire")

    monkeypatch.setattr("user_rl.cloud.checkpoint.save_checkpoint", broken_disk)
    learner = serving_learner({**REACH, "learner": {**REACH["learner"], "checkpoint_every_s": 0.1}})
    wait_until(lambda: "checkpointer" in learner.status()["errors"], 30, "the checkpoint failure in the status")
    assert learner.status()["errors"]["checkpointer"] == "RuntimeError: the checkpoint disk is on fire"

    def no_buffer():
        raise RuntimeError("the sampler cannot reach the buffer")

    learner.sampler.buffer = no_buffer  # the sampler thread's next turn raises
    wait_until(lambda: "sampler" in learner.status()["errors"], 30, "the dead sampler in the status")
    status = learner.status()
    assert status["errors"]["sampler"] == "RuntimeError: the sampler cannot reach the buffer"
    loop = serving_learner.loop_of(learner)  # with no sampler no update can come: the learner stops, saying why
    loop.join(30)
    assert (
        loop.error
        == "RuntimeError: the learner's sampler thread stopped: RuntimeError: the sampler cannot reach the buffer"
    )
    lines: list[str] = []
    ProgressPrinter(tmp_path / "metrics.jsonl", lines.append, every_s=0.0).progress(1.0, status)
    print("\n".join(lines))
    assert "ERROR checkpointer: RuntimeError: the checkpoint disk is on fire" in lines
    assert "ERROR sampler: RuntimeError: the sampler cannot reach the buffer" in lines


def test_a_killed_trainer_process_shows_in_the_status_and_stops_the_learner_saying_why(
    tmp_path: Path, serving_learner
) -> None:
    learner = serving_learner(REACH)
    os.kill(learner.trainer.process.pid, signal.SIGKILL)  # e.g. the kernel's OOM killer
    loop = serving_learner.loop_of(learner)
    loop.join(30)
    assert loop.error == "RuntimeError: the learner's trainer process stopped: the trainer process ended (exit code -9)"
    status = learner.status()
    assert status["errors"]["trainer"] == "the trainer process ended (exit code -9)"
    lines: list[str] = []
    ProgressPrinter(tmp_path / "metrics.jsonl", lines.append, every_s=0.0).progress(1.0, status)
    assert "ERROR trainer: the trainer process ended (exit code -9)" in lines


# -- step credit -------------------------------------------------------------------------------
def test_step_credit_is_a_per_robot_increment_that_never_stops_a_paced_fleet() -> None:
    common = {"learning_starts": 2000, "utd_ratio": 1.0, "batch_transitions": 32, "max_env_steps": 100_000}
    # Before learning starts, 4 robots share what is left of the warm-up, plus a batch each.
    assert credit_increment(updates=0, env_steps=1000, robots=4, **common) == 250 + 32
    # Updates have caught up with the data: one batch each, never 0 (0 would mean unpaced).
    assert credit_increment(updates=3000, env_steps=5000, robots=4, **common) == 32
    # The learner is behind the data (e.g. resumed from an older checkpoint): the robots wait (a
    # negative increment; grants never shrink) while it catches up, and it never waits for them then.
    assert credit_increment(updates=40_000, env_steps=50_000, robots=4, **common) == -2000 + 32
    # Near the end of the run the share of what is left bounds it.
    assert credit_increment(updates=99_000, env_steps=99_600, robots=4, **common) == 100


def test_a_paced_fleet_holds_at_each_eval_point_with_exactly_the_updates_its_steps_earn(
    tmp_path: Path, serving_learner
) -> None:
    """stop.eval_every_env_steps: a learning curve at exact env steps, each point with the updates a serial
    loop (one per step after learning_starts) would have made, for comparison with another library."""
    paced = {
        **REACH,
        "fleet": {"num_robots": 1, "pace_to_learner": True, "batch_transitions": 16},
        "stop": {"eval_every_env_steps": 150, "eval_every_s": None, "max_env_steps": 1000},
    }
    cfg = build_config(paced)
    assert cfg.stop.next_eval_steps(0) == 150 and cfg.stop.next_eval_steps(150) == 300
    learner = serving_learner(paced)
    learner.set_hold(150)  # as the launcher sets it before any edge steps
    edge = make_edge(cfg, 0, learner.addresses["data"], learner.addresses["weights"], tmp_path / "spool")
    runner = GuardedThread("edge", edge.run)
    runner.start()
    try:
        for point in (150, 300):
            earned = point - 100  # utd_ratio 1 after learning_starts 100
            wait_until(
                lambda: (learner.env_steps, learner.updates) == (point, earned),
                60,
                f"the fleet and the updates at {point} env steps",
            )
            assert not updates_caught_up(cfg, {"updates": earned - 1}, point)
            assert updates_caught_up(cfg, {"updates": earned}, point)
            time.sleep(0.5)  # held there until the launcher moves the point on
            assert (learner.env_steps, learner.updates) == (point, earned)
            learner.set_hold(cfg.stop.next_eval_steps(point))
    finally:
        edge.stop()
        runner.join(30)
        edge.close()
