"""The update as a CUDA graph (`user_rl/algos/graphed.py`): on a GPU it trains exactly as the update
written out does, falls back to it where a graph cannot hold the update, and on a CPU is that update.

The GPU tests run where CUDA is (the device machine: `python -m pytest tests/algos/test_algos_graphed.py`);
CI has no GPU, so there the CPU tests stand for the trainer's path and the batch packing."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.support.batches import buffer_batch
from user_rl.algos import SAC, make_algo
from user_rl.algos.graphed import (
    WARMUP,
    GraphedUpdate,
    PackedColumns,
    capturable,
    layout_of,
    make_updater,
    training_batch,
)
from user_rl.cloud.batches import training_columns
from user_rl.hal.registry import robot_spaces

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="a CUDA GPU (the device machine); CI has none")
STATE = {"obs_mode": "state", "episode_steps": 50}
PIXELS = {"obs_mode": "image", "episode_steps": 50, "image_size": 32}


def host_columns(algo, obs_space, action_space, seed: int, size: int = 64) -> dict[str, torch.Tensor]:
    """One batch of training columns on the host, as a trainer slot holds them."""
    batch = buffer_batch(obs_space, action_space, np.random.default_rng(seed), size=size)
    return {
        k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in training_columns(batch, algo.batch_columns).items()
    }


def twins(algo_type: str, options: dict, device: str, policy: str = "mlp", policy_options: dict | None = None):
    """Two copies of one freshly built algorithm on `device`, and its robot's spaces."""
    obs_space, action_space = robot_spaces("mujoco_reach", options)
    torch.manual_seed(0)
    algo = make_algo(algo_type, obs_space, action_space, policy, policy_options or {"hidden": [64, 64]}, None, device)
    return algo, copy.deepcopy(algo), obs_space, action_space


def test_on_a_cpu_the_trainer_steps_the_update_as_written():
    algo, twin, obs_space, action_space = twins("sac", STATE, "cpu")
    update = make_updater(algo, torch.device("cpu"))
    assert not isinstance(update, GraphedUpdate)
    for seed in range(3):
        columns = host_columns(algo, obs_space, action_space, seed)
        torch.manual_seed(seed)
        ours = update(columns)
        torch.manual_seed(seed)
        theirs = twin.update(training_batch(columns, torch.device("cpu")))
        assert float(ours["critic_loss"]) == float(theirs["critic_loss"])
    assert algo.updates == twin.updates == 3
    for a, b in zip(algo.actor.parameters(), twin.actor.parameters()):
        assert torch.equal(a, b)


def test_a_batch_packs_into_one_buffer_and_reads_back_column_by_column():
    columns = {
        "obs/camera": torch.randint(0, 256, (4, 8, 8, 3), dtype=torch.uint8),
        "obs/joints": torch.randn(4, 7),
        "action": torch.randn(4, 3),
        "terminated": torch.tensor([True, False, False, True]),
        "discount": torch.rand(4, dtype=torch.float64),
    }
    packed = PackedColumns(layout_of(columns), torch.device("cpu"))
    packed.fill(columns)
    for key, tensor in columns.items():
        assert torch.equal(packed.views[key], tensor), key
        assert packed.views[key].data_ptr() % 64 == 0, f"{key} is not aligned"
        assert packed.views[key].data_ptr() - packed.flat.data_ptr() < packed.flat.numel()
    columns["obs/joints"][0, 0] = 123.0  # the buffer holds a copy, refilled per batch
    assert packed.views["obs/joints"][0, 0] != 123.0


def graphed_against_eager(algo_type: str, options: dict, updates: int = 12, **kwargs) -> GraphedUpdate:
    """Train one copy through the graph and its twin as written, on the same batches from the same RNG
    state: after warm-up, capture and replays both must hold the same weights."""
    algo, twin, obs_space, action_space = twins(algo_type, options, "cuda", **kwargs)
    graphed = GraphedUpdate(algo, torch.device("cuda"))
    batches = [host_columns(algo, obs_space, action_space, seed) for seed in range(updates)]
    torch.cuda.manual_seed(1)
    for columns in batches:
        ours = graphed(columns)
    torch.cuda.manual_seed(1)
    for columns in batches:
        theirs = twin.update(training_batch(columns, torch.device("cuda")))
    assert algo.updates == twin.updates == updates
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-3, atol=1e-4, msg=lambda m, key=key: f"{key}: {m}")
    for (name, a), b in zip(algo.actor.named_parameters(), twin.actor.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    return graphed


@needs_cuda
def test_sac_as_a_cuda_graph_trains_as_the_update_written_out():
    graphed = graphed_against_eager("sac", STATE)
    assert graphed.captured and graphed.eager_updates == WARMUP


@needs_cuda
def test_an_rlpd_ensemble_of_ten_critics_as_a_cuda_graph_trains_as_written():
    from user_rl.algos import SACSettings

    algo_settings = SACSettings(num_critics=10, target_critics=2, critic_layer_norm=True)
    obs_space, action_space = robot_spaces("mujoco_reach", STATE)
    torch.manual_seed(0)
    algo = make_algo("sac", obs_space, action_space, "mlp", {"hidden": [64, 64]}, algo_settings, "cuda")
    graphed = GraphedUpdate(algo, torch.device("cuda"))
    for seed in range(WARMUP + 3):
        metrics = graphed(host_columns(algo, obs_space, action_space, seed))
    assert graphed.captured and algo.updates == WARMUP + 3
    assert torch.isfinite(metrics["critic_loss"])


@needs_cuda
def test_drq_from_pixels_as_a_cuda_graph_trains_as_written(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)  # cuDNN may pick another convolution per stream
    assert graphed_against_eager("drq", PIXELS).captured


@needs_cuda
def test_an_algorithm_that_cannot_be_a_graph_runs_as_written_and_says_why():
    graphed = graphed_against_eager("bc", STATE, updates=WARMUP + 4)
    assert not graphed.captured and "host" in graphed.failed
    assert graphed.eager_updates == WARMUP + 4


class HostReadingSAC(SAC):
    """A plugin's SAC that reads a value on the host in its update: a graph cannot hold that."""

    def update(self, batch: dict) -> dict[str, torch.Tensor]:
        metrics = super().update(batch)
        self.last_q = float(metrics["q"])
        return metrics


@needs_cuda
def test_an_update_whose_capture_fails_runs_as_written_from_that_batch_on():
    obs_space, action_space = robot_spaces("mujoco_reach", STATE)
    torch.manual_seed(0)
    algo = HostReadingSAC(obs_space, action_space, "mlp", {"hidden": [64, 64]}, None, "cuda")
    twin = copy.deepcopy(algo)
    graphed = GraphedUpdate(algo, torch.device("cuda"))
    batches = [host_columns(algo, obs_space, action_space, seed) for seed in range(WARMUP + 3)]
    torch.cuda.manual_seed(1)
    for columns in batches:
        graphed(columns)
    torch.cuda.manual_seed(1)
    for columns in batches:
        twin.update(training_batch(columns, torch.device("cuda")))
    assert not graphed.captured and graphed.failed and graphed.eager_updates == WARMUP + 3
    assert algo.updates == twin.updates == WARMUP + 3  # the failed capture's batch was updated on once
    for a, b in zip(algo.critic.parameters(), twin.critic.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


@needs_cuda
def test_a_batch_of_another_shape_runs_as_written_and_the_graph_serves_the_next():
    algo, _, obs_space, action_space = twins("sac", STATE, "cuda")
    graphed = GraphedUpdate(algo, torch.device("cuda"))
    for seed in range(WARMUP + 1):
        graphed(host_columns(algo, obs_space, action_space, seed))
    assert graphed.captured
    eager_before = graphed.eager_updates
    graphed(host_columns(algo, obs_space, action_space, 99, size=32))
    graphed(host_columns(algo, obs_space, action_space, 100))
    assert graphed.eager_updates == eager_before + 1 and algo.updates == WARMUP + 3


def test_a_checkpoint_of_a_graphed_learner_resumes_on_a_cpu():
    """A GPU learner's optimisers are capturable (and, compiled, foreach): its saved state carries those flags,
    and a CPU learner that loads it must still step (capturable Adam refuses CPU tensors)."""
    graphed, _, obs_space, action_space = twins("sac", STATE, "cpu")
    graphed.update(training_batch(host_columns(graphed, obs_space, action_space, 0), torch.device("cpu")))
    capturable(graphed, fused=False)  # what GraphedUpdate with learner.compile set on the GPU
    saved = graphed.state_dict()
    assert saved["critic_optim"]["param_groups"][0]["capturable"]
    resumed, _, _, _ = twins("sac", STATE, "cpu")
    resumed.load_state_dict(saved)
    resumed.update(training_batch(host_columns(resumed, obs_space, action_space, 1), torch.device("cpu")))
    assert resumed.updates == 2 and not resumed.critic_optim.param_groups[0]["capturable"]
