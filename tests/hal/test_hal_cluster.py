"""A two-node Ray cluster on this machine, each node started with `user-rl node start`: the
sim robots' edges run on the node that owns the simulator slots, the learner on the node the
config asks for (asserted from Ray's node ids), training runs, and a launch that asks for what
no node has fails at once, naming it and the nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from user_rl.testing.wait import free_port

REPO = Path(__file__).resolve().parents[2]
ENV_EXTRA = {"MUJOCO_GL": "egl", "RAY_AUTH_MODE": "token"}
ENV = {**os.environ, **ENV_EXTRA}


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "user_rl.cli", *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout
    )


def cluster_nodes(address: str) -> list[dict]:
    script = (
        "import json, ray; ray.init(address=%r, logging_level='ERROR'); "
        "print(json.dumps([{'id': n['NodeID'], 'alive': n['Alive'], 'labels': n['Labels'], "
        "'resources': n['Resources']} for n in ray.nodes()]))" % address
    )
    done = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """alpha: the head, with 2 mujoco_reach slots; beta: no sim slots, labelled role=learner."""
    logs = tmp_path_factory.mktemp("ray-nodes")
    port = free_port()
    address = f"127.0.0.1:{port}"
    procs = []

    def start(*args: str, name: str) -> None:
        log = open(logs / f"{name}.log", "wb")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "user_rl.cli",
                    "node",
                    "start",
                    *args,
                    "--name",
                    name,
                    "--num-cpus",
                    "1",
                    "--block",
                ],
                cwd=REPO,
                env=ENV,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    try:
        start("--head", "--port", str(port), "--sim-slots", "2", name="alpha")
        deadline = time.monotonic() + 90
        while True:  # the head answers once its GCS is up
            try:
                if cluster_nodes(address):
                    break
            except AssertionError:
                assert time.monotonic() < deadline, (logs / "alpha.log").read_text()[-3000:]
                time.sleep(1)
        start("--address", address, "--sim-slots", "0", "--label", "role=learner", name="beta")
        while len([n for n in cluster_nodes(address) if n["alive"]]) < 2:
            assert time.monotonic() < deadline + 60, (logs / "beta.log").read_text()[-3000:]
            time.sleep(1)
        yield address
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
        stop_cluster(port)


def stop_cluster(port: int) -> None:
    """Stop this cluster's Ray processes only (`ray stop` would stop every Ray instance on the machine)."""

    def cmdline(pid: str) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return ""

    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    gcs = [cmdline(p) for p in pids if f"--gcs_server_port={port}" in cmdline(p)]
    sessions = {
        part.split("=", 1)[1].split("/logs")[0]
        for line in gcs
        for part in line.split()
        if part.startswith("--log_dir=")
    }
    markers = [f":{port}", f"--port {port}", *sessions]
    for pid in pids:
        if int(pid) != os.getpid() and any(m in cmdline(pid) for m in markers) and "ray" in cmdline(pid):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def test_nodes_advertise_their_devices(cluster: str) -> None:
    nodes = {n["labels"]["user-rl/node"]: n for n in cluster_nodes(cluster)}
    assert set(nodes) == {"alpha", "beta"}
    assert nodes["alpha"]["resources"]["sim:mujoco_reach"] == 2.0
    assert "sim:mujoco_reach" not in nodes["beta"]["resources"] and nodes["beta"]["labels"]["role"] == "learner"


def test_launch_places_edges_with_their_sims_and_the_learner_where_asked(cluster: str, tmp_path: Path) -> None:
    done = cli(
        "train",
        "configs/reach.yaml",
        f"run_root={tmp_path}",
        "fleet.num_robots=2",
        "learner.labels={role: learner}",
        "algo.learning_starts=300",
        "algo.batch_size=64",
        "policy.hidden=[32]",
        "stop.max_env_steps=1200",
        "stop.eval_every_s=1000",
        "stop.eval_episodes=2",
        "--address",
        cluster,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (summary_path,) = tmp_path.glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["placement"] == {"learner": "beta", "edge:mujoco_reach-0": "alpha", "edge:mujoco_reach-1": "alpha"}
    assert "placement: edge:mujoco_reach-0 on alpha, edge:mujoco_reach-1 on alpha, learner on beta" in done.stdout
    learner = summary["learner"]
    assert summary["stop_reason"] == "max_env_steps" and learner["updates"] > 0
    assert all(r["transitions"] > 0 for r in learner["robots"].values()) and len(learner["robots"]) == 2


@pytest.mark.parametrize(
    "overrides, named",
    [
        (
            ["robot={type: example_arm, options: {controller: arm-bench:7700}}", "fleet.num_robots=1"],
            "edge example_arm-0: needs resource 'robot:example_arm-0', which no node has",
        ),
        (["fleet.num_robots=3"], "edge mujoco_reach-2: the cluster's 'sim:mujoco_reach' are all taken"),
        (["learner.resources={gpu_box: 1}"], "learner: needs resource 'gpu_box', which no node has"),
        (["fleet.labels={zone: lab}"], "no node has the labels zone=lab"),
    ],
)
def test_launch_that_cannot_fit_fails_at_once_naming_what_is_missing(
    cluster: str, tmp_path: Path, arm_driver: dict, overrides: list[str], named: str
) -> None:
    config = "configs/reach.yaml"
    if overrides[0].startswith("robot="):  # a real robot that no node owns (its options replace the sim's)
        config = str(tmp_path.parent / "arm.yaml")
        Path(config).write_text(
            yaml.safe_dump({"robot": {"type": "example_arm", "options": {"controller": "arm-bench:7700"}}})
        )
        overrides = overrides[1:]
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "user_rl.cli",
            "launch",
            config,
            f"run_root={tmp_path}",
            *overrides,
            "--address",
            cluster,
        ],
        cwd=REPO,
        env={**arm_driver, **ENV_EXTRA},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert named in done.stderr
    assert (
        "Nodes: alpha (CPU 1, sim:gym 2, sim:mujoco_reach 2, user-rl/node=alpha); "
        "beta (CPU 1, role=learner, user-rl/node=beta)"
    ) in done.stderr
    assert not list(tmp_path.iterdir()), "a refused launch left a run directory"
    assert time.monotonic() - started < 60


HOLDER = """
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
@ray.remote(num_cpus=0, resources={"sim:mujoco_reach": 2})
class Holder:
    def ready(self):
        return True
holder = Holder.remote()
ray.get(holder.ready.remote())
print("holding", flush=True)
sys.stdin.read()  # until the test closes it
"""


def test_a_learner_that_cannot_start_stops_the_launch_saying_what_it_waits_for(cluster: str, tmp_path: Path) -> None:
    """Another run holds both simulator slots: the launch fits the cluster (totals), but the learner,
    which asks for a slot, is never placed. The launch gives up after learner.start_timeout_s."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, cluster], env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        started = time.monotonic()
        done = cli(
            "train",
            "configs/reach.yaml",
            f"run_root={tmp_path}",
            "fleet.num_robots=1",
            "learner.resources={'sim:mujoco_reach': 1}",
            "learner.start_timeout_s=5",
            "--address",
            cluster,
            timeout=180,
        )
        took = time.monotonic() - started
    finally:
        holder.stdin.close()
        holder.wait(60)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert (
        "user-rl: the learner did not start within 5 s (learner.start_timeout_s); Ray may still be waiting "
        "for a node with what it holds: {'sim:mujoco_reach': 1.0}" in done.stderr
    ), done.stderr[-3000:]
    assert took < 120, took  # it gave up; the edge it would have started was never placed either
