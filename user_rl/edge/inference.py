"""Asynchronous chunk inference on the edge: the next chunk is inferred while the current one runs.

A VLA takes tens to hundreds of milliseconds per inference; inferring inside the control loop
would stop the robot that long every H steps. Here a worker thread infers, and the loop only takes
actions from the chunk in hand. The next inference starts from the observation of step k once the
actions left in the current chunk cover the expected latency (`lead_steps`, from measured latency
and control period). Its chunk is planned from step k on, so when it arrives at step k + d (the
robot kept moving meanwhile), the loop switches to it at its index d: the robot runs each action
at the step it was planned for (the time-aligned switch of LeRobot's async inference and of
real-time chunking, Black et al. 2025, without its inpainting).

The loop waits only when it has no action at all: at an episode's start or after `restart()` (a
chunk planned for a state the robot has left), and when one inference takes longer than a chunk
lasts (counted in `starved_steps`).

Weights are swapped by the worker between two inferences (`swap`), never under a running one and
never in the control loop.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import nn

from user_rl.policies.chunking import chunk_length, infer_chunk
from user_rl.policies.weights import load_received

LATENCY_WINDOW = 50  # inferences whose latency the status summarises


class AsyncChunkRunner:
    """Drop-in for `ChunkRunner` on an edge: `runner(obs) -> (action, index in its chunk)`."""

    def __init__(
        self,
        actor: nn.Module,
        deterministic: bool = False,
        device: str = "cpu",
        period_s: float | None = None,
        margin_steps: int = 1,
    ) -> None:
        """`period_s`: the control loop's period (1 / control_hz). None: the loop has no clock of its
        own (a sim stepped as fast as it goes, which waits for the policy anyway), so each chunk is
        inferred when the last one runs out and runs from its start, as `ChunkRunner` does, only on
        the worker (and `device`). `margin_steps`: how many steps early, beyond the measured latency,
        the next inference starts."""
        self.actor = actor.to(device)
        self.device = torch.device(device)
        self.deterministic = deterministic
        self.horizon = chunk_length(actor)
        self.margin_steps = margin_steps
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chunk-inference")
        self._swap_lock = threading.Lock()
        self._new_state: tuple[dict[str, torch.Tensor], int] | None = None
        self._loaded = -1  # the version of the weights the worker has loaded
        self._pending: Future | None = None
        self._pending_step = 0  # the step whose observation the pending inference reads
        self._chunk: np.ndarray | None = None
        self._chunk_step = 0  # the step the chunk in hand was planned from
        self.version = -1  # the version of the weights that planned the chunk in hand
        self._step = 0  # control steps since the last restart
        self.period_s = period_s or 0.0
        # Infer ahead only with a clock and a chunk to overlap with: without a clock nothing moves
        # while the loop waits, so a chunk planned one step early would start at its index 1 from a
        # stale observation; with H = 1 every chunk planned ahead would arrive stale.
        self._ahead = self.period_s > 0 and self.horizon > 1
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self.inferences = 0
        self.starved_steps = 0  # steps that waited for an inference
        self.stale_chunks = 0  # chunks that arrived after every step they planned had passed
        self.chunk_age = 0  # steps between the chunk's observation and the action just returned

    # -- weights -------------------------------------------------------------------------------
    def swap(self, state: dict[str, torch.Tensor], version: int = -1) -> None:
        """New weights (policy `version`), loaded by the worker before its next inference (the newest
        one wins)."""
        with self._swap_lock:
            self._new_state = (state, version)

    def _load_pending_weights(self) -> int:
        """Load weights handed over since the last inference; the version now loaded."""
        with self._swap_lock:
            new, self._new_state = self._new_state, None
        if new is not None:
            load_received(self.actor, new[0])
            self._loaded = new[1]
        return self._loaded

    # -- inference -----------------------------------------------------------------------------
    @torch.no_grad()
    def _infer(self, obs: dict[str, np.ndarray]) -> tuple[np.ndarray, float, int]:
        version = self._load_pending_weights()
        started = time.monotonic()
        chunk = infer_chunk(self.actor, obs, self.deterministic, self.device)
        return chunk, time.monotonic() - started, version

    def _submit(self, obs: dict[str, np.ndarray]) -> None:
        self._pending = self._worker.submit(self._infer, {k: np.array(v) for k, v in obs.items()})
        self._pending_step = self._step

    def _take_pending(self) -> None:
        """Switch to the finished inference's chunk at the index of this step (or drop it if stale)."""
        assert self._pending is not None
        future, planned_at, self._pending = self._pending, self._pending_step, None
        chunk, latency, version = future.result()  # an inference that raised raises here, in the loop
        self.latencies.append(latency)
        self.inferences += 1
        if self._step - planned_at >= len(chunk):
            self.stale_chunks += 1
            return
        self._chunk, self._chunk_step, self.version = chunk, planned_at, version

    def lead_steps(self) -> int:
        """How many steps before the chunk in hand runs out the next inference must start."""
        if not self.latencies or self.period_s <= 0:
            return 0  # no latency measured yet, or no clock: the chunk in hand runs out first
        return min(self.horizon - 1, math.ceil(max(self.latencies) / self.period_s) + self.margin_steps)

    def _left(self) -> int:
        """Actions of the chunk in hand from this step on."""
        return 0 if self._chunk is None else max(0, len(self._chunk) - (self._step - self._chunk_step))

    def __call__(self, obs: dict[str, np.ndarray]) -> tuple[np.ndarray, int]:
        if self._pending is not None and self._pending.done():
            self._take_pending()
        while self._left() == 0:  # no action for this step: wait for one
            if self._pending is None:
                self._submit(obs)
            if self._chunk is not None:
                self.starved_steps += 1
            self._pending.result()
            self._take_pending()
        index = self._step - self._chunk_step
        action = self._chunk[index]
        self.chunk_age = index
        if self._ahead and self._pending is None and len(self._chunk) - index - 1 <= self.lead_steps():
            self._submit(obs)  # planned from this step's observation, so its index 0 is this step
        self._step += 1
        return action, index

    def restart(self) -> None:
        """The next action starts a new chunk from the next observation (an inference under way is
        left to finish and then dropped)."""
        if self._pending is not None:
            self._pending.cancel()  # if not yet started; a running one finishes unread
        self._pending = None
        self._chunk = None
        self._step = 0

    def status(self) -> dict[str, Any]:
        latencies = np.fromiter(self.latencies, float)
        return {
            "inference_ms": round(1000 * float(latencies.mean()), 2) if latencies.size else None,
            "inference_p99_ms": round(1000 * float(np.percentile(latencies, 99)), 2) if latencies.size else None,
            "chunk_age_steps": self.chunk_age,
            "lead_steps": self.lead_steps(),
            "starved_steps": self.starved_steps,
            "stale_chunks": self.stale_chunks,
            "inferences": self.inferences,
        }

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)
