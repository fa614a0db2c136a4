"""An algorithm's update captured once as a CUDA graph and replayed for every batch after it.

Why: the networks a learner trains for a robot are small, so on a GPU an update is bound by
launching its kernels, not by running them: SAC with two 128-wide critics ran at 0.07x a plain
supervised step on an H100, at the rate of the textbook SAC loop (`bench/gpu_updates.py`). A CUDA
graph launches all of an update's kernels (forward, backward, Adam, the target networks) as one.

How: the first `WARMUP` updates run as written (on a side stream, as capture asks), so every lazy
allocation (Adam's moments, cuBLAS's workspaces) is made; the next batch is copied into static
input tensors on the device and its update captured with `torch.cuda.graph`; every later batch is
copied into those same tensors and the graph replayed. The optimisers are made capturable then
(fused Adam keeps its step counts on the device already), so the host never waits for them.
With `learner.compile`, `torch.compile` fuses the update's small kernels before it is captured
(fewer, larger kernels per replay; compiling costs a minute or so when the learner starts). A batch
goes up in one copy: its columns are packed into a pinned staging buffer laid out like the device's
(two of them, so the next batch is packed while the last one still travels). The update's metrics
are the graph's output tensors: each replay overwrites them, and reading them waits for the device,
so the trainer reads them only when it reports, as it did before.

Where a graph cannot serve, the update runs as written, and says why once: on a CPU; an algorithm
that declares why it cannot be one (`not_graphable`: behaviour cloning picks its rows on the host); an
update that does what a graph cannot hold (reads a value on the host, makes a tensor from Python
values: capture raises, and nothing of that batch's update has run, so it runs as written); a batch
of other columns or shapes than the captured one. `learner.cuda_graph: false` turns it off.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch

from user_rl.algos.base import RUNTIME_FLAGS, Algorithm
from user_rl.wire.transitions import NEXT_OBS, OBS

log = logging.getLogger(__name__)

WARMUP = 3  # eager updates before capture: Adam's state and cuBLAS's workspaces exist after the first
ALIGN = 64  # bytes: every column starts at a multiple of this in the staging and device buffers

Columns = dict[str, torch.Tensor]
Metrics = dict[str, torch.Tensor]


def make_updater(
    algo: Algorithm, device: torch.device, cuda_graph: bool = True, compile: bool = False
) -> Callable[[Columns], Metrics]:
    """What the trainer calls per batch of training columns (flat: obs/..., next_obs/..., action, ...): the
    update as a replayed CUDA graph where it can be (compiled first with `compile`), else `algo.update` on
    the columns moved to `device`."""
    if cuda_graph and device.type == "cuda":
        return GraphedUpdate(algo, device, compile)
    return lambda columns: algo.update(training_batch(columns, device))


def training_batch(columns: Columns, device: torch.device) -> dict:
    """The flat training columns as the dict an algorithm's `update` takes (obs and next_obs as dicts), on `device`."""
    out: dict = {"obs": {}, "next_obs": {}}
    for key, tensor in columns.items():
        tensor = tensor.to(device, non_blocking=False)
        if key.startswith(NEXT_OBS):
            out["next_obs"][key.removeprefix(NEXT_OBS)] = tensor
        elif key.startswith(OBS):
            out["obs"][key.removeprefix(OBS)] = tensor
        else:
            out[key] = tensor
    return out


def layout_of(columns: Columns) -> tuple[tuple[str, tuple[int, ...], torch.dtype], ...]:
    """What a captured graph was made for: each column's name, shape and dtype."""
    return tuple((key, tuple(t.shape), t.dtype) for key, t in columns.items())


def capturable(algo: Algorithm, fused: bool) -> list[tuple[dict, dict]]:
    """Make the algorithm's optimisers (its attributes that are one) capturable in a CUDA graph (slower where no
    graph replays them), and say what their flags were; fused (one opaque kernel) or not, which `torch.compile` turns
    into kernels of its own, fused with the rest: measured on an H200, SAC's compiled graph replayed at
    3,526 updates/s with Adam compiled against 3,230 with the fused kernel, and uncompiled at 1,976 fused
    against 1,576 (bench/graph_kernels.py, issue 34). Adam keeps its step counts on the device either way."""
    written = []
    for optimiser in (value for value in vars(algo).values() if isinstance(value, torch.optim.Optimizer)):
        for group in optimiser.param_groups:
            written.append((group, {key: group[key] for key in RUNTIME_FLAGS if key in group}))
            group["capturable"] = True
            if "fused" in group:
                group["fused"], group["foreach"] = (True, False) if fused else (None, True)
    return written


class PackedColumns:
    """Columns of one layout as views into one flat byte buffer (`ALIGN`ed), so a batch moves in one copy."""

    def __init__(self, layout: tuple, device: torch.device, pin: bool = False) -> None:
        offsets, total = [], 0
        for _, shape, dtype in layout:
            offsets.append(total)
            nbytes = torch.Size(shape).numel() * dtype.itemsize
            total += -(-nbytes // ALIGN) * ALIGN
        self.flat = torch.empty(max(total, ALIGN), dtype=torch.uint8, device=device, pin_memory=pin)
        self.views = {
            key: self.flat[offset : offset + torch.Size(shape).numel() * dtype.itemsize].view(dtype).view(shape)
            for (key, shape, dtype), offset in zip(layout, offsets)
        }

    def fill(self, columns: Columns) -> None:
        for key, tensor in columns.items():
            self.views[key].copy_(tensor)


class GraphedUpdate:
    """`algo.update` as a CUDA graph: eager for `WARMUP` batches, captured on the next, replayed after."""

    def __init__(self, algo: Algorithm, device: torch.device, compile: bool = False) -> None:
        self.algo, self.device = algo, device
        self.failed: str | None = getattr(algo, "not_graphable", None)  # why the update runs as written for good
        self.step = algo.update  # what is captured: the update as written, or compiled
        self.written_flags: list[tuple[dict, dict]] = []  # the optimisers' flags as the algorithm made them
        if self.failed is None:
            self.written_flags = capturable(algo, fused=not compile)  # before warm-up: compiling again costs
            if compile:
                self.step = torch.compile(algo.update)
        self.eager_updates = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.layout: tuple | None = None
        self.static: PackedColumns | None = None
        self.staging: list[PackedColumns] = []
        self.copied: list[torch.cuda.Event] = []
        self.next_staging = 0
        self.outputs: Metrics = {}
        self.side = torch.cuda.Stream(device)
        self._said_other_layout = False

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, columns: Columns) -> Metrics:
        if self.failed is not None:
            if self.eager_updates == 0:
                log.info("the %s update runs without a CUDA graph: %s", self.algo.name, self.failed)
            return self.eager(columns)
        if self.graph is None:
            if self.eager_updates < WARMUP:
                return self.eager(columns, side_stream=True)
            return self.capture(columns)
        if layout_of(columns) != self.layout:
            if not self._said_other_layout:
                log.warning("a batch with other columns or shapes than the captured update's runs eagerly")
                self._said_other_layout = True
            return self.eager(columns)
        self.upload(columns)
        self.graph.replay()
        self.algo.updates += 1
        return self.outputs

    def eager(self, columns: Columns, side_stream: bool = False) -> Metrics:
        """The update as written (the warm-up runs on a side stream, as CUDA graph capture asks)."""
        self.eager_updates += 1
        if not side_stream:
            return self.algo.update(training_batch(columns, self.device))
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "This instance was constructed with capturable=True")  # warm-up
            metrics = self.step(training_batch(columns, self.device))
        torch.cuda.current_stream(self.device).wait_stream(self.side)
        return metrics

    def upload(self, columns: Columns) -> None:
        """Copy a batch into the static inputs: packed on the host, one copy up (device columns copy directly)."""
        if any(t.device.type != "cpu" for t in columns.values()):
            self.static.fill(columns)
            return
        index = self.next_staging
        self.next_staging = (index + 1) % len(self.staging)
        self.copied[index].synchronize()  # its last batch has left for the device
        self.staging[index].fill(columns)
        self.static.flat.copy_(self.staging[index].flat, non_blocking=True)
        self.copied[index].record(torch.cuda.current_stream(self.device))

    def capture(self, columns: Columns) -> Metrics:
        """Capture the update on this batch's static copy; replay it once (this batch's update)."""
        self.layout = layout_of(columns)
        self.static = PackedColumns(self.layout, self.device)
        self.staging = [PackedColumns(self.layout, torch.device("cpu"), pin=True) for _ in range(2)]
        self.copied = [torch.cuda.Event() for _ in self.staging]
        for event in self.copied:
            event.record(torch.cuda.current_stream(self.device))
        self.upload(columns)
        updates = self.algo.updates
        stream = torch.cuda.current_stream(self.device)
        generator = torch.cuda.default_generators[self.device.index or 0]
        rng = generator.clone_state()  # a failed capture leaves the generator capturing: this undoes it
        graph = torch.cuda.CUDAGraph()
        try:
            torch.cuda.synchronize(self.device)
            with torch.cuda.graph(graph):
                self.outputs = self.step(training_batch(self.static.views, self.device))
        except Exception as exc:  # what a graph cannot hold: the update runs as written from now on
            torch.cuda.set_stream(stream)  # left on the capture's stream when ending the capture failed
            generator.graphsafe_set_state(rng)
            self.algo.updates = updates
            self.failed = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log.warning("the %s update runs without a CUDA graph: capture failed (%s)", self.algo.name, self.failed)
            for group, flags in self.written_flags:
                group.update(flags)
            torch.cuda.synchronize(self.device)
            return self.eager(columns)
        self.algo.updates = updates  # capture records the update; it runs only when replayed
        self.graph = graph
        log.info("the %s update is captured as a CUDA graph after %d eager updates", self.algo.name, WARMUP)
        self.graph.replay()
        self.algo.updates += 1
        return self.outputs
