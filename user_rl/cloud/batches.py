"""Batch preparation for the trainer process: sample from the replay buffer into the trainer's
free shared-memory slots, so up to `learner.prefetch_batches` batches wait ready for it.

The trainer then only reads a slot and steps the optimiser (on a GPU it copies the slot to the
device first, and hands it back before the update runs).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

from user_rl.cloud.buffer.store import NEXT_OBS, PersistentReplay
from user_rl.cloud.trainer import Trainer
from user_rl.wire.transitions import OBS

TRAINING_COLUMNS = ("action", "reward", "terminated", "discount")  # besides obs/* and next_obs/*


def training_columns(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The columns `SAC.update` reads (the buffer's batch also carries policy_version, robot)."""
    return {key: array for key, array in batch.items()
            if key.startswith((OBS, NEXT_OBS)) or key in TRAINING_COLUMNS}


class BatchPreparer:
    """The sampler thread's work: `run()` fills the trainer's free slots until `stop` is set.

    `buffer()` and `trainer()` return them once they exist (the first hello may open the buffer).
    A batch is sent only while `may_submit()` holds, checked under the trainer's `send_lock`, so
    a pause or the pacing stops the updates exactly. `rng_lock` is held around each sample (the
    buffer is safe for one writer and one sampler thread; a checkpoint reads the RNG's state).
    """

    def __init__(self, buffer: Callable[[], PersistentReplay | None], trainer: Callable[[], Trainer | None],
                 batch_size: int, rng: np.random.Generator, may_submit: Callable[[], bool],
                 stop: threading.Event, rng_lock: threading.Lock) -> None:
        self.buffer = buffer
        self.trainer = trainer
        self.batch_size = batch_size
        self.rng = rng
        self.may_submit = may_submit
        self.stop = stop
        self.rng_lock = rng_lock
        self.held_back_s = 0.0  # waiting for the paced fleet's data once training runs
        self.prepared = 0

    def run(self) -> None:
        while not self.stop.is_set():
            buffer, trainer = self.buffer(), self.trainer()
            if buffer is None or trainer is None or not self.may_submit():
                waited = time.perf_counter()
                self.stop.wait(0.002)
                if trainer is not None and trainer.submitted:
                    self.held_back_s += time.perf_counter() - waited
                continue
            if not trainer.free_slot(timeout=0.1):  # every slot holds a batch: the trainer is busy
                continue
            with self.rng_lock:
                columns = training_columns(buffer.sample(self.batch_size, self.rng))
            with trainer.send_lock:  # paused (or paced) while sampling: this batch is not sent
                if self.may_submit() and trainer.submit(columns):
                    self.prepared += 1
