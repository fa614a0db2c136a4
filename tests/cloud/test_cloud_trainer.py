"""The trainer process (real spawned processes, real shared memory): it trains exactly as SAC
(or behaviour cloning) does in one process, answers a request only after every batch posted
before it, resumes from a state, and never outlives a learner that was killed."""

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

from user_rl.algos import SAC, BCSettings, BehaviourCloning, SACSettings, make_algo
from user_rl.algos.graphed import training_batch
from user_rl.cloud.batches import training_columns
from user_rl.cloud.learner import Learner
from user_rl.cloud.trainer import ActorReply, StateReply, Tag, Trainer, TrainerFailed, TrainerSpec
from user_rl.config import build_config
from user_rl.hal.registry import robot_spaces
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb

REACH_OPTIONS = {"obs_mode": "state", "episode_steps": 50}


def spec(**changes) -> TrainerSpec:
    obs_space, action_space = robot_spaces("mujoco_reach", REACH_OPTIONS)
    fields = {
        "obs_space": obs_space,
        "action_space": action_space,
        "policy": "mlp",
        "policy_options": {"hidden": [32]},
        "settings": SACSettings(),
        "device": "cpu",
        "threads": 1,
        "seed": 3,
        "publish_every_updates": 5,
        **changes,
    }
    return TrainerSpec(**fields)


def batches(count: int, size: int = 16, wanted: tuple[str, ...] = SAC.batch_columns) -> list[dict[str, np.ndarray]]:
    """Batches as the buffer's sampler gives them, cut to the columns an algorithm reads (`wanted`),
    as the learner's sampler thread sends them."""
    s = spec()
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        obs = {
            k: rng.uniform(-1, 1, (size, *space.shape)).astype(space.dtype) for k, space in s.obs_space.spaces.items()
        }
        nxt = {
            k: rng.uniform(-1, 1, (size, *space.shape)).astype(space.dtype) for k, space in s.obs_space.spaces.items()
        }
        out.append(
            {
                **{f"obs/{k}": v for k, v in obs.items()},
                **{f"next_obs/{k}": v for k, v in nxt.items()},
                "action": rng.uniform(-1, 1, (size, *s.action_space.shape)).astype(np.float32),
                "reward": rng.normal(size=size).astype(np.float32),
                "terminated": rng.random(size) < 0.1,
            }
        )
        out[-1]["actor"] = rng.choice([pb.ACTOR_POLICY, pb.ACTOR_HUMAN, pb.ACTOR_SCRIPTED], size).astype(np.uint8)
        out[-1]["policy_version"] = np.ones(size, np.int64)
    return [training_columns(batch, wanted) for batch in out]


def post_all(trainer: Trainer, columns: list[dict[str, np.ndarray]]) -> None:
    for batch in columns:
        assert trainer.free_slot(timeout=30), "the trainer never freed a slot"
        with trainer.send_lock:
            assert trainer.submit(batch)


def finish_resumed(resumed_spec: TrainerSpec, columns: list[dict[str, np.ndarray]], done: int) -> StateReply:
    """A trainer resumed after `done` of `columns`: it starts at that count, trains on the rest,
    and answers with its final state."""
    resumed = Trainer(resumed_spec, depth=2)
    try:
        assert resumed.updates == resumed.submitted == done
        post_all(resumed, columns[done:])
        return replies_until_state(resumed)[1]
    finally:
        resumed.close()


@pytest.fixture
def trainer():
    started = Trainer(spec(), depth=3)
    yield started
    started.close()


def replies_until_state(trainer: Trainer, timeout: float = 60.0) -> tuple[list[ActorReply], StateReply]:
    """Every actor handed back, then the state asked for (requested here, after what was posted)."""
    with trainer.send_lock:
        trainer.request_state(Tag.CHECKPOINT)
    actors: list[ActorReply] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for reply in trainer.replies(timeout=0.5):
            if isinstance(reply, StateReply):
                return actors, reply
            actors.append(reply)
    raise AssertionError("the trainer never answered the state request")


def test_the_trainer_process_trains_exactly_as_sac_in_this_process(trainer: Trainer) -> None:
    columns = batches(12)
    assert set(columns[0]) == {"obs/state", "next_obs/state", "action", "reward", "terminated"}  # as small as before
    post_all(trainer, columns)
    actors, reply = replies_until_state(trainer)
    # Every batch posted before the request is trained on before the answer.
    assert reply.updates == trainer.updates == trainer.submitted == 12
    # The actor comes back after update 1 and every `publish_every_updates` (5) updates, with metrics.
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
    after = finish_resumed(spec(state=middle.state, rng=middle.rng), columns, done=3)
    assert after.updates == straight.updates == 6
    for name, tensor in straight.state["critic"].items():
        assert torch.equal(after.state["critic"][name], tensor), name


def test_the_trainer_process_trains_and_resumes_behaviour_cloning() -> None:
    """`algo: bc` in the trainer process: the same weights as in this process, only the columns BC
    reads cross the shared memory, and a resume from the state in the middle ends where a run
    straight through does."""
    bc = spec(algo="bc", settings=BCSettings(actor_lr=1e-3))
    columns = batches(8, wanted=BehaviourCloning.batch_columns)
    assert set(columns[0]) == {"obs/state", "action", "intervened", "policy_acted"}  # no next_obs, reward, ...
    first = Trainer(bc, depth=3)
    try:
        assert first.batch_columns == BehaviourCloning.batch_columns
        post_all(first, columns[:4])
        actors, middle = replies_until_state(first)
        post_all(first, columns[4:])
        _, straight = replies_until_state(first)
    finally:
        first.close()
    print(f"bc metrics after update {actors[-1].updates}: {actors[-1].metrics}")
    assert set(actors[-1].metrics) == {"bc_loss", "action_nll", "action_mse", "imitated_rows"}
    assert middle.state["algo"] == "bc" and straight.updates == 8

    after = finish_resumed(
        spec(algo="bc", settings=BCSettings(actor_lr=1e-3), state=middle.state, rng=middle.rng), columns, done=4
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the trainer
    try:
        torch.manual_seed(3)
        local = make_algo("bc", bc.obs_space, bc.action_space, "mlp", {"hidden": [32]}, BCSettings(actor_lr=1e-3))
        for batch in columns:
            local.update(training_batch({k: torch.from_numpy(v) for k, v in batch.items()}, torch.device("cpu")))
    finally:
        torch.set_num_threads(threads)
    assert after.updates == 8
    for name, tensor in straight.state["actor"].items():
        assert torch.equal(after.state["actor"][name], tensor), f"resumed: {name} differs"
        assert torch.equal(local.state_dict()["actor"][name], tensor), f"in-process: {name} differs"


def test_a_state_of_another_algorithm_stops_the_trainer_saying_why() -> None:
    s = spec()
    bc_state = make_algo("bc", s.obs_space, s.action_space, "mlp", {"hidden": [32]}).state_dict()
    with pytest.raises(TrainerFailed, match="written by algorithm 'bc', not 'sac': set algo.type: bc"):
        Trainer(spec(state=bc_state), depth=2)


def test_the_learner_builds_the_configured_algorithm(tmp_path: Path) -> None:
    learner = Learner(
        build_config(
            {
                "robot": {"type": "mujoco_reach", "options": REACH_OPTIONS},
                "fleet": {"num_robots": 1},
                "policy": {"hidden": [32]},
                "algo": {"type": "bc", "policy_row_weight": 0.1},
                "learner": {"torch_threads": 1},
            }
        ),
        tmp_path / "run",
    )
    try:
        assert learner.trainer is not None and learner.trainer.batch_columns == BehaviourCloning.batch_columns
        assert learner.status()["updates"] == 0
    finally:
        learner.close()


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
    config.write_text(
        yaml.safe_dump(
            {
                "robot": {"type": "mujoco_reach", "options": REACH_OPTIONS},
                "fleet": {"num_robots": 1},
                "policy": {"hidden": [32]},
            }
        )
    )
    learner = subprocess.Popen(
        [sys.executable, "-c", KILLED_LEARNER, str(config), str(tmp_path / "run")], stdout=subprocess.PIPE, text=True
    )
    try:
        trainer_pid = int(learner.stdout.readline())
        assert Path(f"/proc/{trainer_pid}").exists()
    finally:
        learner.send_signal(signal.SIGKILL)  # no clean stop: nobody tells the trainer
        learner.wait(30)
    started = time.monotonic()
    wait_until(
        lambda: (
            not Path(f"/proc/{trainer_pid}").exists()
            or "zombie" in Path(f"/proc/{trainer_pid}/status").read_text().lower()
        ),
        10,
        "the orphaned trainer to exit",
    )
    print(f"the trainer exited {time.monotonic() - started:.2f} s after its learner was killed")


KILLED_AT_FIRST_BATCH = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, os.getcwd())                  # the repository root (cwd): `tests` is imported from it
    from tests.cloud.test_cloud_trainer import batches, post_all, spec
    from user_rl.cloud.trainer import Trainer

    if __name__ == "__main__":
        trainer = Trainer(spec(), depth=4)
        print(trainer.process.pid, flush=True)
        post_all(trainer, batches(1))                # the slots go to the trainer with this first batch
        time.sleep(float(sys.argv[1]))
        os.kill(os.getpid(), signal.SIGKILL)         # the learner killed while the trainer fetches them
""")


def test_a_learner_killed_as_its_trainer_receives_the_slots_is_no_trainer_failure(tmp_path: Path) -> None:
    """The trainer fetches each slot's memory from the learner's process over a connection of its own;
    a learner killed meanwhile resets them. Seen once in ~25 kills of a kill schedule as the trainer
    'dying' with ConnectionResetError in `slots_channel.get`: it must leave quietly and at once."""
    script = tmp_path / "killed_at_first_batch.py"
    script.write_text(KILLED_AT_FIRST_BATCH)
    delays = (0.0, 0.003, 0.006, 0.01)  # the kill lands before, during and after the hand-over
    logs = [tmp_path / f"learner-{i}.log" for i in range(len(delays))]
    learners = []
    for delay, log in zip(delays, logs):
        with open(log, "w") as err:
            learners.append(
                subprocess.Popen(
                    [sys.executable, str(script), str(delay)],
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    cwd=Path(__file__).resolve().parents[2],
                )
            )
    trainers = [int(learner.stdout.readline()) for learner in learners]
    for learner in learners:
        assert learner.wait(60) == -signal.SIGKILL
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(map(gone, trainers)):
        time.sleep(0.1)
    said = {delay: log.read_text() for delay, log in zip(delays, logs)}
    assert not [delay for delay, text in said.items() if "Error" in text or "Traceback" in text], said
    assert all(map(gone, trainers)), "an orphaned trainer still waits for its slots"


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA GPU (the device machine); CI has none")
def test_on_a_gpu_the_trainer_process_replays_its_update_as_a_cuda_graph_and_trains_as_sac_does() -> None:
    columns = batches(12)
    gpu = Trainer(spec(device="cuda"), depth=3)
    try:
        post_all(gpu, columns)
        actors, reply = replies_until_state(gpu)
    finally:
        gpu.close()
    assert reply.updates == 12 and [r.updates for r in actors] == [1, 5, 10]
    torch.manual_seed(3)  # what the trainer does before it builds its SAC
    s = spec()
    local = SAC(s.obs_space, s.action_space, "mlp", {"hidden": [32]}, SACSettings(), device="cuda")
    for batch in columns:  # the update as written, on the GPU: the graph must have trained the same
        local.update(training_batch({k: torch.from_numpy(v) for k, v in batch.items()}, torch.device("cuda")))
    for name, ours in local.state_dict()["actor"].items():
        torch.testing.assert_close(reply.state["actor"][name], ours.cpu(), rtol=1e-3, atol=1e-5, msg=name)
