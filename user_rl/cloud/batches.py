"""Batch preparation for the trainer process: sample from the replay buffer into the trainer's
free shared-memory slots, so up to `learner.prefetch_batches` batches wait ready for it.

The trainer then only reads a slot and steps the optimiser (on a GPU it copies the slot to the
device first, and hands it back before the update runs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from user_rl.algos import SAC
from user_rl.cloud.buffer.store import NothingToSample, PersistentReplay
from user_rl.cloud.trainer import Trainer
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import IDLE, NEXT_OBS, OBS, intervened

log = logging.getLogger(__name__)

GROUPS = {"obs": OBS, "next_obs": NEXT_OBS}  # a name in `batch_columns` that stands for every column of a prefix
# In the buffer's batch only for n-step returns (discount) or a chunk policy (buffer.action_horizon > 1).
OPTIONAL = {"discount", "action_chunk", "chunk_mask", "chunk_intervened", "chunk_policy_acted"}


def _chunk_intervened(batch: dict[str, np.ndarray], idle_weight: float) -> np.ndarray:
    """1 per action of a row's chunk that a person or the scripted intervener executed, 0 past its
    episode's end; an idle one (its person held nothing) after the row itself weighs `idle_weight`.
    (The row itself was drawn by the sampler, which weighed it so already: never under `idle_rows: drop`.)"""
    weight = (intervened(batch["chunk_actor"]) & batch["chunk_mask"]).astype(np.float32)
    idle = batch.get("chunk_" + IDLE)
    if idle is not None and idle_weight != 1.0:
        later = idle.copy()
        later[:, 0] = False
        weight[later] *= idle_weight
    return weight


DERIVED = {  # float32 columns computed from who acted (algorithms never see the wire's enum)
    "intervened": ("actor", lambda batch, idle_weight: intervened(batch["actor"]).astype(np.float32)),
    "policy_acted": ("actor", lambda batch, idle_weight: (batch["actor"] == pb.ACTOR_POLICY).astype(np.float32)),
    # per action of a row's chunk, and 0 past its episode's end
    "chunk_intervened": ("chunk_actor", _chunk_intervened),
    "chunk_policy_acted": (
        "chunk_actor",
        lambda batch, idle_weight: ((batch["chunk_actor"] == pb.ACTOR_POLICY) & batch["chunk_mask"]).astype(np.float32),
    ),
}


def training_columns(
    batch: dict[str, np.ndarray], wanted: tuple[str, ...] = SAC.batch_columns, idle_weight: float = 0.0
) -> dict[str, np.ndarray]:
    """The columns the algorithm reads (its `batch_columns`), and nothing else of the buffer's
    batch (policy_version, robot, ... stay here), so a batch slot is no bigger than it must be.

    "intervened" and "policy_acted" are derived from the `actor` column, their chunk_ versions
    from `chunk_actor` (where an idle step after the row weighs `idle_weight`: the buffer's
    `idle_weight`, 0 under the default `idle_rows: drop`). A column the algorithm needs and the
    batch lacks is an error that names it (only the `OPTIONAL` ones may be missing)."""
    out: dict[str, np.ndarray] = {}
    for name in wanted:
        if name in GROUPS:
            out.update((key, array) for key, array in batch.items() if key.startswith(GROUPS[name]))
        elif name in batch:
            out[name] = batch[name]
        elif name in DERIVED and DERIVED[name][0] in batch:
            out[name] = DERIVED[name][1](batch, idle_weight)
        elif name not in OPTIONAL:
            source = f" (derived from the {DERIVED[name][0]} column)" if name in DERIVED else ""
            raise ValueError(
                f"the algorithm needs the batch column {name!r}{source}; the buffer's batch has "
                f"{', '.join(sorted(batch))}"
            )
    return out


class BatchPreparer:
    """The sampler thread's work: `run()` fills the trainer's free slots until `stop` is set.

    `buffer()` and `trainer()` return them once they exist (the first hello may open the buffer).
    A batch is sent only while `may_submit()` holds, checked under the trainer's `send_lock`, so
    a pause or the pacing stops the updates exactly. `rng_lock` is held around each sample (the
    buffer is safe for one writer and one sampler thread; a checkpoint reads the RNG's state).
    """

    def __init__(
        self,
        buffer: Callable[[], PersistentReplay | None],
        trainer: Callable[[], Trainer | None],
        batch_size: int,
        rng: np.random.Generator,
        may_submit: Callable[[], bool],
        stop: threading.Event,
        rng_lock: threading.Lock,
    ) -> None:
        self.buffer = buffer
        self.trainer = trainer
        self.batch_size = batch_size
        self.rng = rng
        self.may_submit = may_submit
        self.stop = stop
        self.rng_lock = rng_lock
        self.held_back_s = 0.0  # waiting for the paced fleet's data once training runs
        self.prepared = 0
        self.empty_waits = 0  # turns that found nothing to draw in RAM (all stale, discarded or outside the mix)

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
            try:
                with self.rng_lock:
                    columns = training_columns(
                        buffer.sample(self.batch_size, self.rng), trainer.batch_columns, buffer.idle_weight
                    )
            except NothingToSample as exc:  # fresh data, or a cold segment the prefetcher swaps in, ends it
                if not self.empty_waits % 600:  # the first time, then once a minute while it lasts
                    log.warning("training waits: %s", exc)
                self.empty_waits += 1
                self.stop.wait(0.1)
                continue
            with trainer.send_lock:  # paused (or paced) while sampling: this batch is not sent
                if self.may_submit() and trainer.submit(columns):
                    self.prepared += 1
