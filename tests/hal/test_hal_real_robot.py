"""Real robots (drivers with `device_kind = "robot"`): a driver must say how it holds, and a real
robot never waits for the learner: with the default config (pacing on, which is for sims) it keeps
acting at its own rate through a learner outage, and every step it took is stored once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml

from tests.support.example_arm import arm_controller
from user_rl.cloud.buffer.index import BufferIndex
from user_rl.config import build_config
from user_rl.edge.factory import make_edge
from user_rl.hal import DeviceDescriptor, Robot, StepResult
from user_rl.hal.registry import make_robot, register_robot
from user_rl.testing.wait import free_port, wait_until


class Slider(Robot):
    """One joint on a rail, pure numpy: what a driver minimally is. Counts how often it was built."""

    device_kind = "robot"
    built = 0

    def __init__(self, *, robot_id: str = "slider-0", seed: int | None = None) -> None:
        type(self).built += 1
        self.descriptor = DeviceDescriptor(kind=self.device_kind, model="slider", id=robot_id, control_hz=20.0)
        self.observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1.0, 1.0, (1,), np.float32)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.x = np.zeros(1, np.float32)

    def reset(self, seed: int | None = None):
        self.x[:] = 0.0
        return {"x": self.x.copy()}

    def step(self, action: np.ndarray) -> StepResult:
        self.x = np.clip(self.x + 0.1 * action, -1, 1).astype(np.float32)
        return StepResult({"x": self.x.copy()}, 0.0, False, False, np.asarray(action, np.float32))


class HoldingSlider(Slider):
    def hold(self) -> None:
        pass  # a real driver commands its servos to keep the pose here


class SimSlider(Slider):
    device_kind = "sim"  # a sim does not move between steps: the base (empty) hold is a hold


register_robot("test_slider_without_hold")(Slider)
register_robot("test_slider_with_hold")(HoldingSlider)
register_robot("test_sim_slider")(SimSlider)
register_robot("test_slider_factory_without_hold")(lambda **options: Slider(**options))


def test_a_real_robot_driver_without_hold_is_refused_with_what_to_implement() -> None:
    built = Slider.built
    with pytest.raises(TypeError) as refused:
        make_robot("test_slider_without_hold", robot_id="s")
    assert str(refused.value) == (
        "robot driver 'test_slider_without_hold' (test_hal_real_robot.Slider) is a real robot (device_kind = "
        '"robot") but does not implement hold(): the e-stop and the watchdog need it to stop the arm and keep '
        "its pose"
    )
    assert Slider.built == built  # refused before it connected to anything
    with pytest.raises(TypeError, match="'test_slider_factory_without_hold' .* does not implement hold"):
        make_robot("test_slider_factory_without_hold")  # a factory function: refused once it shows its class
    assert make_robot("test_slider_with_hold").device_kind == "robot"
    assert make_robot("test_sim_slider").device_kind == "sim"


# -- a learner outage ---------------------------------------------------------------------------
def start_learner(config: Path, run_dir: Path, log, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "user_rl.cli", "learner", str(config), "--run-dir", str(run_dir)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    status = run_dir / "learner_status.json"
    wait_until(
        lambda: status.exists() and json.loads(status.read_text()).get("pid") == proc.pid, 90, "the learner to come up"
    )
    return proc


@pytest.fixture
def arm_at_20hz(arm_driver: dict) -> Iterator[str]:
    """The example arm's simulated controller, stepping at 20 Hz; its HOST:PORT."""
    with arm_controller("--rate-hz", "20") as controller:
        yield controller


def test_a_real_robot_keeps_acting_through_a_learner_outage_with_the_default_config(
    tmp_path: Path, arm_driver: dict, arm_at_20hz: str, monkeypatch
) -> None:
    monkeypatch.syspath_prepend(arm_driver["PYTHONPATH"].split(os.pathsep)[0])  # the arm driver, in this process too
    rate_hz, outage_s, controller = 20.0, 10.0, arm_at_20hz
    data_port, weights_port = free_port(), free_port()
    cfg_dict = {
        "robot": {"type": "example_arm", "options": {"controller": controller, "episode_steps": 50}},
        "fleet": {"num_robots": 1},  # no pacing override: the default paces sims
        "policy": {"hidden": [32]},
        "algo": {"learning_starts": 100, "batch_size": 32},
        "learner": {"data_port": data_port, "weights_port": weights_port, "torch_threads": 1},
    }
    config = tmp_path / "arm.yaml"
    config.write_text(yaml.safe_dump(cfg_dict))
    cfg = build_config(cfg_dict)
    assert cfg.fleet.pace_to_learner, "the default is meant to pace (sims)"
    run_dir = tmp_path / "run"
    with open(tmp_path / "learner.log", "ab") as log:
        proc = start_learner(config, run_dir, log, arm_driver)
        edge = make_edge(cfg, 0, f"tcp://127.0.0.1:{data_port}", f"tcp://127.0.0.1:{weights_port}", tmp_path / "spool")
        assert not edge.settings.pace_to_learner
        runner = threading.Thread(target=edge.run, daemon=True)
        runner.start()
        try:
            wait_until(lambda: edge.link.welcomed and edge.steps >= 60, 60, "the robot to stream")
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            before, started = edge.steps, time.monotonic()
            time.sleep(outage_s)
            acted, elapsed = edge.steps - before, time.monotonic() - started
            backlog = edge.link.unacked
            print(
                f"outage: {acted} steps in {elapsed:.1f} s ({acted / elapsed:.1f}/s at {rate_hz:g} Hz), "
                f"{backlog} batches spooled"
            )
            assert acted >= 0.8 * rate_hz * outage_s, "the robot stopped acting while the learner was down"
            proc = start_learner(config, run_dir, log, arm_driver)
            wait_until(lambda: edge.link.unacked <= 1, 60, "the backlog to reach the restarted learner")
            time.sleep(1.0)
            edge.stop()
            runner.join(30)
            assert edge.detach(60), edge.status()
        finally:
            edge.stop()
            runner.join(30)
            edge.close()
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    index = BufferIndex(run_dir / "buffer" / "index.sqlite", read_only=True)
    try:
        keys, records = index.batch_keys(), sum(s.records for s in index.segments(status=None))
    finally:
        index.close()
    produced = {(edge.link.robot_id, edge.link.epoch, seq) for seq in range(1, edge.link.seq + 1)}
    print(f"stored {len(keys)} batches ({len(set(keys))} distinct), {records} records for {edge.steps} steps")
    assert len(keys) == len(set(keys)) and set(keys) == produced
    assert records == edge.steps  # every step stored, once
