"""docs/guides/add-a-robot-driver.md, step by step: its file blocks are the example package's files;
the package, installed with pip, is found through its entry point; `user-rl hal discover` probes the
arm (the package's simulated controller, a process of its own) and prints the row the guide shows;
the guide's `user-rl learner` and `user-rl attach` stream the arm's steps to the learner; `user-rl
status` shows the robot; Ctrl-C detaches the edge and stops the learner cleanly.

The commands are read from the guide and run as written, with this test's paths and free ports
(`key=value` overrides, which the guide's commands accept too). `user-rl train` with the same
package is tests/hal/test_hal_discovery.py's. About 35 s here.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from tests.docs.guide_blocks import commands, drift
from tests.support.example_arm import arm_controller, example_arm_env
from user_rl.testing.wait import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "add-a-robot-driver.md"
PACKAGE = "examples/user_rl_example_arm"
CONFIG = f"{PACKAGE}/example_arm.yaml"
USER_RL = [sys.executable, "-m", "user_rl.cli"]


def test_the_guides_files_are_the_example_packages() -> None:
    assert not drift(GUIDE)
    shown = GUIDE.read_text()
    for path in ("pyproject.toml", "example_arm.yaml", "user_rl_example_arm/driver.py"):
        assert f"<!-- file: {PACKAGE}/{path} -->" in shown


def guide_command(prefix: str) -> list[str]:
    """The one command of the guide's bash blocks that starts with `prefix`, as words."""
    found = [shlex.split(line, comments=True) for line in commands(GUIDE) if line.startswith(prefix)]
    assert len(found) == 1, f"the guide has {len(found)} commands starting with {prefix!r}"
    return found[0]


def with_overrides(words: list[str], after: int, overrides: list[str]) -> list[str]:
    """`user-rl` run from this checkout, `key=value` overrides put right after the positional arguments."""
    assert words[0] == "user-rl"
    return USER_RL + words[1:after] + overrides + words[after:]


def test_the_guides_steps_discover_the_arm_and_stream_its_steps(tmp_path: Path) -> None:
    assert guide_command("pip install") == ["pip", "install", "-e", PACKAGE]
    env = {**example_arm_env(), "XDG_STATE_HOME": str(tmp_path / "state")}  # the edge's default spool goes here
    assert guide_command("python -m user_rl_example_arm.simulated_controller")[3:] == ["--listen", "127.0.0.1:7700"]
    (tmp_path / "examples").symlink_to(REPO / "examples")  # the guide's paths are relative to the checkout
    run_dir = tmp_path / "runs" / "example_arm"

    def start(words: list[str]) -> subprocess.Popen:  # in the checkout's stand-in, output in one text pipe
        return subprocess.Popen(
            words, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    def run(words: list[str], timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(words, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=timeout)

    with arm_controller() as controller:
        overrides = [
            f"robot.options.controller={controller}",
            f"learner.data_port={free_port()}",
            f"learner.weights_port={free_port()}",
        ]
        learner_cmd = guide_command("user-rl learner")
        assert learner_cmd[2] == CONFIG and learner_cmd[3:] == ["--run-dir", "runs/example_arm"]
        learner = start(with_overrides(learner_cmd, 3, overrides))
        try:
            discover = guide_command("user-rl hal discover")  # while the learner starts
            found = run(with_overrides(discover, 4, overrides[:1]), timeout=120)
            assert found.returncode == 0, found.stdout + found.stderr
            shown_row = next(line for line in GUIDE.read_text().splitlines() if line.startswith("robot  example_arm-0"))
            assert shown_row in found.stdout.splitlines(), found.stdout

            status_file = run_dir / "learner_status.json"
            wait_until(lambda: status_file.exists(), 120, "the learner to write its status")
            attach_cmd = guide_command("user-rl attach")
            assert attach_cmd[2:] == [CONFIG, "example_arm-0", "--run-dir", "runs/example_arm"]
            edge = start(with_overrides(attach_cmd, 4, overrides[:1]))
            try:

                def stored() -> int:
                    robots = json.loads(status_file.read_text()).get("robots") or {}
                    return (robots.get("example_arm-0") or {}).get("transitions", 0)

                wait_until(lambda: stored() >= 48, 90, "the arm's steps to reach the learner")
                table = run(USER_RL + guide_command("user-rl status runs/")[1:], timeout=60)
                assert table.returncode == 0, table.stderr
                row = next(line for line in table.stdout.splitlines() if line.startswith("example_arm-0 "))
                assert row.split()[1] == "ok"  # the driver's health probe, through the edge's heartbeat
            finally:
                edge.send_signal(signal.SIGINT)  # Ctrl-C
                edge_out, _ = edge.communicate(timeout=90)
            assert edge.returncode == 0, edge_out
            assert "edge example_arm-0: detached after" in edge_out
            assert (tmp_path / "state" / "user-rl" / "spool" / "example_arm-0").is_dir()
        finally:
            learner.send_signal(signal.SIGINT)
            learner_out, _ = learner.communicate(timeout=120)
    assert learner.returncode == 0, learner_out
    assert "learner stopped; checkpoint" in learner_out
    assert (run_dir / "checkpoint.pt").is_file()
