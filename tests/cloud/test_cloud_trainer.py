"""The trainer process (real spawned processes, real shared memory): it trains exactly as SAC
does in one process, answers a request only after every batch posted before it, and never
outlives a learner that was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from user_rl.algos import SAC, SACSettings
from user_rl.cloud.trainer import Reply, Trainer, TrainerFailed, TrainerSpec, training_batch
from user_rl.hal.registry import robot_spaces
from user_rl.testing.wait import wait_until

REACH_OPTIONS = {"obs_mode": "state", "episode_steps": 50}


def spec(**changes) -> TrainerSpec:
    obs_space, action_space = robot_spaces("mujoco_reach", REACH_OPTIONS)
    fields = {"obs_space": obs_space, "action_space": action_space, "policy": "mlp",
              "policy_options": {"hidden": [32]}, "settings": SACSettings(), "device": "cpu", "threads": 1,
              "seed": 3, "publish_every": 5, **changes}
    return TrainerSpec(**fields)


def batches(count: int, size: int = 16) -> list[dict[str, np.ndarray]]:
    """Columns as the buffer's sampler gives them (obs/*, next_obs/*, action, reward, terminated)."""
    s = spec()
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        obs = {k: rng.uniform(-1, 1, (size, *space.shape)).astype(space.dtype) for k, space in s.obs_space.spaces.items()}
        nxt = {k: rng.uniform(-1, 1, (size, *space.shape)).astype(space.dtype) for k, space in s.obs_space.spaces.items()}
        out.append({**{f"obs/{k}": v for k, v in obs.items()}, **{f"next_obs/{k}": v for k, v in nxt.items()},
                    "action": rng.uniform(-1, 1, (size, *s.action_space.shape)).astype(np.float32),
                    "reward": rng.normal(size=size).astype(np.float32),
                    "terminated": rng.random(size) < 0.1})
    return out


def post_all(trainer: Trainer, columns: list[dict[str, np.ndarray]]) -> None:
    for batch in columns:
        assert trainer.free_slot(timeout=30), "the trainer never freed a slot"
        with trainer.send_lock:
            assert trainer.submit(batch)


@pytest.fixture
def trainer():
    started = Trainer(spec(), depth=3)
    yield started
    started.close()


def replies_until_state(trainer: Trainer, timeout: float = 60.0) -> tuple[list[Reply], Reply]:
    """Every actor handed back, then the state asked for (requested here, after what was posted)."""
    with trainer.send_lock:
        trainer.request("state", tag="checkpoint")
    actors: list[Reply] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for reply in trainer.replies(timeout=0.5):
            if reply.kind == "state":
                return actors, reply
            actors.append(reply)
    raise AssertionError("the trainer never answered the state request")


def test_the_trainer_process_trains_exactly_as_sac_in_this_process(trainer: Trainer) -> None:
    columns = batches(12)
    post_all(trainer, columns)
    actors, reply = replies_until_state(trainer)
    # Every batch posted before the request is trained on before the answer.
    assert reply.updates == trainer.updates == trainer.submitted == 12
    # The actor comes back after update 1 and every `publish_every` (5) updates, with metrics.
    assert [r.updates for r in actors] == [1, 5, 10]
    assert set(actors[-1].metrics) == {"critic_loss", "actor_loss", "alpha", "q"}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the trainer (sums over another thread count round differently)
    try:
        torch.manual_seed(3)  # what the trainer does before it builds its SAC
        s = spec()
        local = SAC(s.obs_space, s.action_space, "mlp", {"hidden": [32]}, SACSettings())
        for batch in columns:
            local.update(training_batch({k: torch.from_numpy(v) for k, v in batch.items()}, torch.device("cpu")))
    finally:
        torch.set_num_threads(threads)
    for part in ("actor", "critic", "critic_target"):
        theirs, ours = reply.state[part], local.state_dict()[part]
        assert theirs.keys() == ours.keys()
        for name in ours:
            assert torch.equal(theirs[name], ours[name]), f"{part}.{name} differs"
    assert torch.equal(reply.state["log_alpha"], local.state_dict()["log_alpha"])


def test_a_resumed_trainer_goes_on_from_the_state_and_rng_it_was_given(trainer: Trainer) -> None:
    columns = batches(6)
    post_all(trainer, columns[:3])
    _, middle = replies_until_state(trainer)
    post_all(trainer, columns[3:])
    _, straight = replies_until_state(trainer)
    resumed = Trainer(spec(state=middle.state, rng=middle.rng), depth=2)
    try:
        assert resumed.updates == resumed.submitted == 3
        post_all(resumed, columns[3:])
        _, after = replies_until_state(resumed)
    finally:
        resumed.close()
    assert after.updates == straight.updates == 6
    for name, tensor in straight.state["critic"].items():
        assert torch.equal(after.state["critic"][name], tensor), name


def test_a_trainer_that_dies_is_reported_with_its_exit_code(trainer: Trainer) -> None:
    os.kill(trainer.process.pid, signal.SIGKILL)
    trainer.process.join(10)
    with pytest.raises(TrainerFailed, match="exit code -9"):
        trainer.check()
    assert trainer.error == "the trainer process ended (exit code -9)"


KILLED_LEARNER = textwrap.dedent("""
    import sys, threading, yaml
    from pathlib import Path
    from user_rl.cloud.learner import Learner
    from user_rl.config import build_config
    learner = Learner(build_config(yaml.safe_load(open(sys.argv[1]))), Path(sys.argv[2]))
    threading.Thread(target=learner.run, daemon=True).start()
    print(learner.trainer.process.pid, flush=True)
    threading.Event().wait()                     # until SIGKILL
""")


def test_the_trainer_never_outlives_a_killed_learner(tmp_path: Path) -> None:
    config = tmp_path / "reach.yaml"
    config.write_text(yaml.safe_dump({"robot": {"type": "mujoco_reach", "options": REACH_OPTIONS},
                                      "fleet": {"num_robots": 1}, "policy": {"hidden": [32]}}))
    learner = subprocess.Popen([sys.executable, "-c", KILLED_LEARNER, str(config), str(tmp_path / "run")],
                               stdout=subprocess.PIPE, text=True)
    try:
        trainer_pid = int(learner.stdout.readline())
        assert Path(f"/proc/{trainer_pid}").exists()
    finally:
        learner.send_signal(signal.SIGKILL)  # no clean stop: nobody tells the trainer
        learner.wait(30)
    started = time.monotonic()
    wait_until(lambda: not Path(f"/proc/{trainer_pid}").exists()
               or "zombie" in Path(f"/proc/{trainer_pid}/status").read_text().lower(), 10,
               "the orphaned trainer to exit")
    print(f"the trainer exited {time.monotonic() - started:.2f} s after its learner was killed")
