"""docs/guides/deploy.md, step by step, with two "machines" on this one: a GPU box and robot
controller arm-0, each a directory standing in for its / (etc/user-rl, var/lib/user-rl).

Keys are made with the guide's `keys generate` line; the robot gets exactly the files the guide
copies to it. The learner runs as the learner unit's ExecStart says, and the edge as the edge
unit's (instance arm-0): systemd is not available here, so each ExecStart line is read from the
unit file in examples/deploy/ and started as a process, with this test's directories, free ports
and the example arm's simulated controller put in for the real ones, and stopped with SIGTERM as
`systemctl stop` stops it. Data must arrive over the encrypted link, `user-rl status ADDRESS
--keys ... --robot ops` (the guide's command, with the ops key copied as the guide says) must show
the robot, a status request without keys must get no answer, and both services must stop cleanly.
The guide's Ray cluster commands are checked without a cluster: `node start` with --dry-run, the
launch's config and overrides validated. About 35 s here.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.guide_blocks import commands, drift, file_blocks
from tests.support.example_arm import arm_controller, example_arm_env
from user_rl.cli import main
from user_rl.cloud.endpoints import this_machine_address
from user_rl.config import load_config
from user_rl.status import NoStatus, ask_learner
from user_rl.testing.wait import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "deploy.md"
DEPLOY = REPO / "examples" / "deploy"
USER_RL = "/opt/user-rl/venv/bin/user-rl"
LEARNER_HOST = "gpu-box.lab.example"


def test_the_guides_files_are_the_deploy_examples() -> None:
    assert not drift(GUIDE)
    assert set(file_blocks(GUIDE)) == {
        "examples/deploy/lab.yaml",
        "examples/deploy/user-rl-learner.service",
        "examples/deploy/user-rl-edge@.service",
    }


def guide_lines(containing: str) -> list[list[str]]:
    """The guide's bash commands that contain `containing`, as words."""
    return [shlex.split(line, comments=True) for line in commands(GUIDE) if containing in line]


def exec_start(unit: str, instance: str = "") -> list[str]:
    """A unit file's ExecStart, as words, with `%i` the instance name (systemd's own substitution)."""
    text = (DEPLOY / unit).read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart=").replace("%i", instance))


class Machine:
    """A machine of the guide, as a directory standing in for its /; `ours` maps the guide's
    addresses and ports to this test's."""

    def __init__(self, root: Path, ours: dict[str, str]) -> None:
        self.root = root
        self.ours = {"/etc/user-rl": f"{root}/etc/user-rl", "/var/lib/user-rl": f"{root}/var/lib/user-rl", **ours}
        self._pattern = re.compile("|".join(re.escape(k) for k in sorted(self.ours, key=len, reverse=True)))

    def path(self, text: str) -> str:
        """The text with this machine's paths and the test's ports (one pass: nothing is replaced twice)."""
        return self._pattern.sub(lambda found: self.ours[found.group(0)], text)

    def command(self, words: list[str]) -> list[str]:
        """`sudo -u user-rl /opt/.../user-rl ARGS` as this checkout's user-rl, on this machine's paths."""
        if words[:3] == ["sudo", "-u", "user-rl"]:
            words = words[3:]
        assert words[0] in (USER_RL, "user-rl"), words
        return [sys.executable, "-m", "user_rl.cli", *(self.path(w) for w in words[1:])]

    def install_config(self) -> None:
        """/etc/user-rl/lab.yaml: the guide's config, the same on every machine."""
        target = self.root / "etc" / "user-rl" / "lab.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.path((DEPLOY / "lab.yaml").read_text()))


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen, log: Path, timeout: float) -> str:
    """`systemctl stop`: SIGTERM, then wait (TimeoutStopSec)."""
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout)
    return log.read_text()


def test_the_guides_deployment_runs_a_learner_and_an_encrypted_edge(tmp_path: Path, capsys) -> None:
    env = example_arm_env()
    data_port, weights_port = free_port(), free_port()
    learner_address = f"tcp://127.0.0.1:{data_port}"
    with arm_controller() as controller:
        ports = {
            f"{LEARNER_HOST}:5555": f"127.0.0.1:{data_port}",
            "5555": str(data_port),
            "5556": str(weights_port),
            "192.168.1.10:7700": controller,
        }
        gpu_box, arm_0 = Machine(tmp_path / "gpu-box", ports), Machine(tmp_path / "arm-0", ports)
        for machine in (gpu_box, arm_0):
            machine.install_config()

        (generate,) = guide_lines(" keys generate ")
        assert main(gpu_box.command(generate)[3:]) == 0  # `user-rl keys generate ...`, in this process
        keys = gpu_box.root / "etc" / "user-rl" / "keys"
        (copy,) = guide_lines("ssh arm-0")  # tar -C /etc/user-rl -cf - FILES... | ssh arm-0 'tar -xpf - ...'
        files = [w for w in copy if w.startswith("keys/")]
        assert files == ["keys/learner.key", "keys/robots/arm-0.key_secret"]
        for name in files:
            target = arm_0.root / "etc" / "user-rl" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(keys.parent / name, target)

        learner_log, edge_log = tmp_path / "learner.log", tmp_path / "edge.log"
        edge_cmd = arm_0.command(exec_start("user-rl-edge@.service", instance="arm-0"))
        assert f"--learner {learner_address}" in " ".join(edge_cmd)
        learner = start(gpu_box.command(exec_start("user-rl-learner.service")), env, learner_log)
        edge = start(edge_cmd, env, edge_log)  # systemd starts them in any order: the edge waits for the learner
        try:
            run_dir = gpu_box.root / "var" / "lib" / "user-rl" / "runs" / "lab"
            status_file = run_dir / "learner_status.json"
            wait_until(status_file.exists, 120, "the learner to start")
            here = this_machine_address()  # bound to every interface, it names the address robots dial
            assert (
                f"learner at tcp://{here}:{data_port} (weights tcp://{here}:{weights_port})" in learner_log.read_text()
            )

            def arm_0_status() -> dict:
                return (json.loads(status_file.read_text()).get("robots") or {}).get("arm-0") or {}

            wait_until(
                lambda: arm_0_status().get("transitions", 0) >= 64,
                90,
                "arm-0's steps to reach the learner over the encrypted link",
            )
            wait_until(lambda: arm_0_status().get("health") == "ok", 30, "arm-0's first heartbeat")

            laptop = tmp_path / "laptop" / "user-rl-keys"  # the ops key, in the layout the guide names
            for name in ("learner.key", "robots/ops.key_secret"):
                (laptop / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(keys / name, laptop / name)
            (status_cmd,) = guide_lines("user-rl status tcp://")
            capsys.readouterr()
            assert main(gpu_box.command([w.replace("~/user-rl-keys", str(laptop)) for w in status_cmd])[3:]) == 0
            table = capsys.readouterr().out
            # robot, health, policy, lag, steps/s, spool (e.g. "927 B"), backlog, stored, quarantined, last error
            row = re.search(r"^arm-0 +(\S+) +\S+ +\S+ +[\d.]+ +\S+ \S+ +\d+ +([\d,]+) ", table, re.M)
            assert row and row[1] == "ok" and int(row[2].replace(",", "")) >= 64, table
            with pytest.raises(NoStatus, match="no learner answered"):
                ask_learner(learner_address, timeout_s=1.0)  # in the clear: no answer
            learner_status = json.loads(status_file.read_text())
            assert learner_status["rejected"] == {} and learner_status["keys_refused"] == {}
        finally:
            edge_out = stop(edge, edge_log, 90)
            learner_out = stop(learner, learner_log, 300)
    assert edge.returncode == 0, edge_out
    assert re.search(r"edge arm-0: detached after \d+ steps \(0 batches left in the spool\)", edge_out), edge_out
    assert (arm_0.root / "var" / "lib" / "user-rl" / "spool" / "arm-0").is_dir()
    assert learner.returncode == 0, learner_out
    assert "learner stopped; checkpoint" in learner_out


def test_the_guides_ray_cluster_commands(capsys) -> None:
    """Without a cluster: the guide's `node start` lines print the `ray start` they would run, and
    its launch line's config and overrides are valid (tests/hal/test_hal_cluster.py runs a cluster)."""
    head, joins = guide_lines("user-rl node start")
    assert main(head[1:] + ["--dry-run"]) == 0
    assert main(joins[1:] + ["--dry-run"]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ray start")]
    assert printed[0].startswith("$ ray start --head --port 6379 ") and "user-rl/node=gpu-box" in printed[0]
    assert (
        printed[1].startswith("$ ray start --address gpu-box.lab.example:6379 ") and "user-rl/node=sim-1" in printed[1]
    )
    assert '"sim:mujoco_reach"' in printed[1]
    (launch,) = guide_lines("user-rl launch")
    config, overrides = launch[2], [w for w in launch[3:] if "=" in w and not w.startswith("--")]
    cfg = load_config(str(REPO / config), overrides)
    assert cfg.learner.labels == {"user-rl/node": "gpu-box"} and cfg.learner.host == "10.0.0.5"
    assert launch[-2:] == ["--address", "gpu-box.lab.example:6379"]
