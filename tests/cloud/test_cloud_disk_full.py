"""A full disk under a running learner (a real one: a small tmpfs holds its run directory): the buffer
stops acknowledging, the learner stays up and `user-rl status` says why (ENOSPC), no temporary file
is left behind, and once there is room again the learner takes and acknowledges data again: every
batch the edge produced ends up acknowledged."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e.harness import EdgeThreads, learner_status, start_learner
from user_rl.cli import main
from user_rl.config import build_config
from user_rl.testing.wait import wait_until

DISK_MB = 16
CONFIG = {
    "robot": {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 50}},
    "policy": {"type": "mlp", "hidden": [16]},
    "algo": {"learning_starts": 100000},  # no training: the test is about the data path
    "fleet": {"num_robots": 1, "pace_to_learner": False, "control_hz": 200, "batch_transitions": 16},
    "learner": {"torch_threads": 1},
}


@pytest.fixture
def small_disk(tmp_path: Path):
    """A DISK_MB tmpfs, unmounted afterwards. A box where it cannot be mounted fails the test: the point
    is a real full filesystem."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    assert done.returncode == 0, f"cannot mount a tmpfs (the test needs root): {done.stderr}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """A file that takes every free byte of the disk."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    return filler


def status_text(target: str, capsys) -> str:
    capsys.readouterr()
    assert main(["status", target]) == 0
    return capsys.readouterr().out


@pytest.mark.timeout(240)
def test_a_full_disk_is_reported_and_the_learner_resumes_when_room_returns(
    small_disk: Path, tmp_path: Path, capsys
) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    run_dir = small_disk / "run"
    with open(tmp_path / "learner.log", "w") as log:
        learner = start_learner(tmp_path / "config.yaml", run_dir, log)
    edges = None
    try:
        addresses = json.loads((run_dir / "addresses.json").read_text())
        edges = EdgeThreads(build_config(CONFIG), addresses["data"], addresses["weights"], tmp_path / "spool")
        wait_until(lambda: learner_status(run_dir)["buffer"] >= 100, 60, "the first rows stored")

        filler = fill(small_disk)
        wait_until(lambda: "ENOSPC" in status_text(str(run_dir), capsys), 60, "the full disk in `user-rl status`")
        shown = status_text(str(run_dir), capsys)
        assert "ERROR storage: buffer write failed" in shown and "No space left on device" in shown, shown
        assert learner.poll() is None, (tmp_path / "learner.log").read_text()[-3000:]
        assert not list(run_dir.glob("*.tmp")), list(run_dir.iterdir())
        stuck = learner_status(run_dir)["buffer"]
        unacked = edges.edges[0].link.unacked
        wait_until(lambda: edges.edges[0].link.unacked > unacked + 1, 30, "the edge spooling unacked batches")
        # Over its socket it still answers, with why it takes no data.
        capsys.readouterr()
        assert main(["status", addresses["data"]]) == 2
        assert "ENOSPC" in capsys.readouterr().err

        filler.unlink()
        wait_until(lambda: learner_status(run_dir)["buffer"] > stuck + 100, 90, "rows stored again")
        assert "ERROR" not in status_text(str(run_dir), capsys).split("\nrobot ")[0]  # the edge's last error may stay
        edges.stop_and_drain()  # every batch produced is acknowledged
        edges = None
        assert learner.poll() is None, (tmp_path / "learner.log").read_text()[-3000:]
        assert "learner restarted" in (tmp_path / "learner.log").read_text()
    finally:
        if edges is not None:
            for edge in edges.edges:
                edge.stop()
        learner.terminate()
        learner.wait(60)


@pytest.mark.timeout(240)
def test_a_launched_learner_resumes_when_room_returns(small_disk: Path, tmp_path: Path) -> None:
    """`user-rl train` runs the learner as a `LearnerService` (a Ray actor) that the launch asks for its
    status every second; here the test asks, as the launch does. The full disk shows in that status,
    and once there is room again the service starts the learner again on its buffer and addresses."""
    from user_rl.services import LearnerService

    cfg = build_config(CONFIG)
    service = LearnerService(cfg.model_dump(), str(small_disk / "run"))
    edges = None
    try:
        addresses = service.addresses()
        edges = EdgeThreads(cfg, addresses["data"], addresses["weights"], tmp_path / "spool")
        wait_until(lambda: service.status()["buffer"] >= 100, 60, "the first rows stored")

        filler = fill(small_disk)
        wait_until(
            lambda: "No space left on device" in (service.status().get("failure") or ""),
            60,
            "the full disk in the learner's status",
        )
        stuck = service.status()["buffer"]
        unacked = edges.edges[0].link.unacked
        wait_until(lambda: edges.edges[0].link.unacked > unacked + 1, 30, "the edge spooling unacked batches")

        filler.unlink()
        wait_until(lambda: service.status()["buffer"] > stuck + 100, 90, "rows stored again")
        status = service.status()
        assert not status.get("failure") and status["error"] is None, status
        assert service.addresses() == addresses  # the edges' addresses stay valid
        edges.stop_and_drain()  # every batch produced is acknowledged
        edges = None
        final = service.finish()
        assert final["error"] is None and not final.get("failure"), final
    finally:
        if edges is not None:
            for edge in edges.edges:
                edge.stop()
        if service.thread.is_alive():
            service.finish()
