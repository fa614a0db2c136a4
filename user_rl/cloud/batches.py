"""Batch preparation off the update thread: sample from the replay buffer, turn the rows into
tensors on the training device, and keep `depth` batches ready in a bounded queue.

The update thread then only pops a batch and steps the optimiser. On a GPU the host arrays are
pinned and copied without blocking, so the copy of the next batch overlaps the current update.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

import numpy as np
import torch

from user_rl.cloud.buffer.store import NEXT_OBS, PersistentReplay
from user_rl.wire.transitions import OBS

TRAINING_COLUMNS = ("action", "reward", "terminated", "discount")  # besides obs/* and next_obs/*


def to_training_batch(batch: dict[str, np.ndarray], device: torch.device) -> dict:
    """The buffer's columns as the tensors `SAC.update` takes (obs and next_obs as dicts)."""
    pin = device.type == "cuda"

    def move(array: np.ndarray) -> torch.Tensor:
        tensor = torch.as_tensor(array)
        if pin:
            tensor = tensor.pin_memory()
        return tensor.to(device, non_blocking=True)

    out: dict = {"obs": {}, "next_obs": {}}
    for key, array in batch.items():
        if key.startswith(NEXT_OBS):
            out["next_obs"][key.removeprefix(NEXT_OBS)] = move(array)
        elif key.startswith(OBS):
            out["obs"][key.removeprefix(OBS)] = move(array)
        elif key in TRAINING_COLUMNS:
            out[key] = move(array)
    return out


class BatchPreparer:
    """The sampler thread's work: `run()` fills the queue until `stop` is set.

    `buffer()` returns the buffer once it exists (the first hello may open it); sampling starts
    once it holds `min_rows`. `rng_lock` is held around each sample (the buffer is safe for one
    writer and one sampler thread; the lock guards the RNG, whose state a checkpoint reads).
    """

    def __init__(self, buffer: Callable[[], PersistentReplay | None], batch_size: int, min_rows: int,
                 rng: np.random.Generator, device: torch.device, depth: int, stop: threading.Event,
                 rng_lock: threading.Lock) -> None:
        self.buffer = buffer
        self.batch_size = batch_size
        self.min_rows = max(1, min_rows)
        self.rng = rng
        self.device = device
        self.ready: queue.Queue[dict] = queue.Queue(maxsize=depth)
        self.stop = stop
        self.rng_lock = rng_lock
        self.prepared = 0

    def run(self) -> None:
        while not self.stop.is_set():
            buffer = self.buffer()
            if buffer is None or len(buffer) < self.min_rows:
                self.stop.wait(0.01)
                continue
            with self.rng_lock:
                rows = buffer.sample(self.batch_size, self.rng)
            batch = to_training_batch(rows, self.device)
            while not self.stop.is_set():
                try:
                    self.ready.put(batch, timeout=0.1)
                    self.prepared += 1
                    break
                except queue.Full:
                    continue

    def take_now(self) -> dict | None:
        """A ready batch if there is one, without waiting."""
        try:
            return self.ready.get_nowait()
        except queue.Empty:
            return None

    def take(self, timeout: float) -> dict | None:
        """The next ready batch, or None if none came within `timeout` seconds."""
        try:
            return self.ready.get(timeout=timeout)
        except queue.Empty:
            return None
