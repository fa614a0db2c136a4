"""The algorithm's updates (SAC, behaviour cloning: `user_rl.algos`) in a process of their own,
fed through shared-memory batch slots.

Why a process: in the learner's process the update thread shared one GIL with the ingest and
the sampler, and every torch op gives the GIL away and must wait to get it back. With 4 robots
streaming on 2 cores that held the updates to 0.7x the plain loop while most of a core sat idle
(`bench/fleet_scaling.py`). Here the updates have an interpreter of their own; only the CPU
(or the GPU) is shared.

The two sides share a ring of `depth` entries: the parent (`Trainer`) copies a sampled batch
into the next free entry's slot and posts it; the child (`serve`) steps the algorithm on it and frees the
entry. Two semaphores count the free and the posted entries: no pipe, no pickling, no helper
thread per batch. Requests (the actor, to publish; the whole state, for a checkpoint) take an
entry of the ring too, so each answer covers every batch posted before it.

The actor comes back in shared buffers (`actor_buffers.py`: one copy on the update thread, none
after). A checkpoint's state is copied on the update thread (between two updates, so it is
consistent) and serialised by a sender thread: the updates go on meanwhile.
"""

from __future__ import annotations

import io
import logging
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.multiprocessing as torch_mp

from user_rl.algos import Algorithm, algo_class, make_algo, metrics_to_floats
from user_rl.algos.graphed import make_updater
from user_rl.cloud.actor_buffers import ActorBuffers
from user_rl.cloud.checkpoint import snapshot
from user_rl.cloud.publish_schedule import PublishSchedule
from user_rl.policies.weights import load_weights
from user_rl.wire.weights import CASTS, PackedWeights

log = logging.getLogger(__name__)

PARENT_CHECK_S = 0.5  # an idle trainer checks this often that the learner is still there
START_TIMEOUT_S = 180.0  # spawning imports torch: seconds on a slow machine


class Entry(IntEnum):
    """What a ring entry asks the trainer for (it crosses the ring as this number)."""

    BATCH = 0  # an update on the batch in the entry's slot
    ACTOR = 1  # hand the actor back
    STATE = 2  # hand the whole state back
    STOP = 3


class Tag(IntEnum):
    """Why the actor or the state was asked for; the reply carries it back (it crosses the ring as this number)."""

    PERIODIC = 0  # the actor the trainer hands back on its own, on its publish schedule
    PAUSE = 1
    CHECKPOINT = 2
    FINAL = 3


@dataclass
class TrainerSpec:
    """What the trainer process builds its algorithm from (it crosses a spawn: picklable)."""

    obs_space: gym.spaces.Dict
    action_space: gym.spaces.Box
    policy: str
    policy_options: dict
    settings: Any  # the algorithm's settings (`cfg.algo`, its Settings class)
    device: str
    threads: int
    seed: int
    publish_every_updates: int | None  # hand the actor back after update 1 and every this many updates
    state: dict | None = None  # a checkpoint's algorithm state to continue from
    rng: dict | None = None  # and its RNG states ("torch", "cuda")
    algo: str = "sac"  # its name in `user_rl.algos.ALGOS`
    initial_weights: str | None = None  # a fresh run's actor starts from this file (`policy.weights`)
    weight_dtype: str = "float32"  # what the actor is published as (`learner.weight_dtype`)
    publish_every_s: float | None = None  # and every this many seconds (publish_schedule.py)
    publish_max_bytes_per_s: float | None = None  # but no more bytes of actor a second than this
    cuda_graph: bool = True  # on a GPU, each update a replayed CUDA graph (`learner.cuda_graph`, algos/graphed.py)
    compile: bool = False  # and torch.compile'd before capture (`learner.compile`)


# -- what the trainer process sends the learner (through its outbox queue: picklable) ----------------
@dataclass(frozen=True)
class Started:
    """The algorithm is built; `updates` it has done (a resumed state's count)."""

    updates: int


@dataclass(frozen=True)
class ActorBuffersMade:
    """The shared buffers every later actor comes back in (sent once, before the first `ActorWritten`)."""

    buffers: ActorBuffers


@dataclass(frozen=True)
class ActorWritten:
    """The actor after `updates` updates is in buffer `index` of the shared actor buffers."""

    tag: Tag
    updates: int
    index: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class StateSerialised:
    """The algorithm's whole state and its RNG states after `updates` updates, as `to_bytes((state, rng))`."""

    tag: Tag
    updates: int
    data: bytes


@dataclass(frozen=True)
class Failed:
    """The trainer process raised; `error` says what (it ends after sending this)."""

    error: str


TrainerMessage = Started | ActorBuffersMade | ActorWritten | StateSerialised | Failed


# -- what the learner's side makes of them -----------------------------------------------------
@dataclass
class ActorReply:
    """The actor's weights packed in a shared buffer, with the latest metrics."""

    tag: Tag
    updates: int
    weights: PackedWeights
    metrics: dict[str, float]


@dataclass
class StateReply:
    """The algorithm's whole state (`state`) and its RNG states (`rng`: "torch", "cuda")."""

    tag: Tag
    updates: int
    state: dict
    rng: dict


Reply = ActorReply | StateReply


def to_bytes(obj: Any) -> bytes:
    out = io.BytesIO()
    torch.save(obj, out)
    return out.getvalue()


def from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


class TrainerFailed(RuntimeError):
    """The trainer process raised or ended; the message says how."""


class Trainer:
    """The learner's side of the trainer process: slots to fill, requests, replies, counters.

    One thread fills entries (`free_slot`, `submit`) and one reads replies (`replies`); both
    hold `send_lock` around what they post, so a request is ordered after every batch before it.
    """

    def __init__(self, spec: TrainerSpec, depth: int, start_timeout_s: float = START_TIMEOUT_S) -> None:
        context = torch_mp.get_context("spawn")  # never fork a process that runs threads (and maybe CUDA)
        self.depth = depth
        self.batch_columns: tuple[str, ...] = algo_class(spec.algo).batch_columns  # what the sampler sends
        self.send_lock = threading.Lock()
        self.error: str | None = None
        self._ring = Ring(context, depth)
        self._slots_channel = context.Queue()  # the slots' shared tensors, once (shaped by the first batch)
        self._outbox = context.Queue()  # TrainerMessage
        self._updates = context.Value("q", 0, lock=False)
        self._idle_us = context.Value("q", 0, lock=False)
        self._next = 0  # the ring entry the next post takes
        self._holding = False  # an entry taken by `free_slot` and not posted yet
        self._slots: dict[str, torch.Tensor] | None = None
        self.actor_buffers: ActorBuffers | None = None  # shared with the trainer, from its first actor on
        self.process = context.Process(
            target=serve,
            name="user-rl-trainer",
            daemon=True,
            args=(spec, self._ring, self._slots_channel, self._outbox, self._updates, self._idle_us, os.getpid()),
        )
        self.process.start()
        ready = self._next_message(start_timeout_s)
        if not isinstance(ready, Started):
            self.close()
            raise TrainerFailed(self.error or f"the trainer process did not start within {start_timeout_s:.0f} s")
        self.submitted = ready.updates  # updates asked for so far (done: `updates`)

    # -- counters ------------------------------------------------------------------------------
    @property
    def updates(self) -> int:
        """Updates done (the trainer counts them; it survives resumes through the state)."""
        return int(self._updates.value)

    @property
    def idle_s(self) -> float:
        """Seconds the trainer sat with no batch to train on, since its first update."""
        return self._idle_us.value / 1e6

    # -- batches -------------------------------------------------------------------------------
    def free_slot(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a free ring entry; True once the sampler holds one
        (it stays held until `submit` posts it)."""
        if not self._holding:
            self._holding = self._ring.free.acquire(timeout=timeout)
        return self._holding

    def submit(self, columns: dict[str, np.ndarray]) -> bool:
        """Copy a batch into the held entry's slot and post it for an update (hold `send_lock`).
        False if no entry is held (a request took it): take another with `free_slot`."""
        if not self._holding:
            return False
        if self._slots is None:  # shaped by the first batch; every batch has the same columns
            self._slots = {
                key: torch.empty((self.depth, *array.shape), dtype=torch.from_numpy(array).dtype).share_memory_()
                for key, array in columns.items()
            }
            self._slots_channel.put(self._slots)
        entry = self._next % self.depth
        for key, tensor in self._slots.items():
            tensor[entry].copy_(torch.from_numpy(columns[key]))
        self._post(entry, Entry.BATCH, Tag.PERIODIC)
        self._holding = False
        self.submitted += 1
        return True

    # -- requests and replies ------------------------------------------------------------------
    def request_actor(self, tag: Tag) -> None:
        """Ask for the actor once the batches posted are done (an `ActorReply` with `tag`)."""
        self._request(Entry.ACTOR, tag)

    def request_state(self, tag: Tag) -> None:
        """Ask for the whole state once the batches posted are done (a `StateReply` with `tag`)."""
        self._request(Entry.STATE, tag)

    def _request(self, entry: Entry, tag: Tag) -> None:
        """Post a request (hold `send_lock` if a thread may be submitting; blocks while the ring is full)."""
        if self._holding:  # the sampler's held entry is ours now; it takes another
            self._holding = False
        else:
            while not self._ring.free.acquire(timeout=PARENT_CHECK_S):
                self.check()
        self._post(self._next % self.depth, entry, tag)

    def _post(self, entry: int, kind: Entry, tag: Tag) -> None:
        self._ring.kinds[entry], self._ring.tags[entry] = kind, tag
        self._next += 1
        self._ring.posted.release()

    def replies(self, timeout: float) -> Iterator[Reply]:
        """The replies that have come (waiting up to `timeout` for the first); raises `TrainerFailed`."""
        message = self._next_message(timeout)
        while message is not None:
            if isinstance(message, ActorBuffersMade):
                self.actor_buffers = message.buffers
            elif isinstance(message, ActorWritten):
                weights = self.actor_buffers.packed(message.index)
                yield ActorReply(message.tag, message.updates, weights, message.metrics)
            elif isinstance(message, StateSerialised):
                state, rng = from_bytes(message.data)
                yield StateReply(message.tag, message.updates, state, rng)
            message = self._next_message(0)
        self.check()

    def wait_for_state(self, tag: Tag, timeout: float) -> StateReply:
        """The reply to a state request just made (other replies that come first are dropped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for reply in self.replies(min(0.5, max(0.0, deadline - time.monotonic()))):
                if isinstance(reply, StateReply) and reply.tag == tag:
                    return reply
        raise TrainerFailed(f"the trainer did not answer a state request within {timeout:.0f} s")

    def _next_message(self, timeout: float) -> TrainerMessage | None:
        try:
            message = self._outbox.get(timeout=timeout) if timeout > 0 else self._outbox.get_nowait()
        except queue.Empty:
            if not self.process.is_alive() and self.error is None:
                self.error = f"the trainer process ended (exit code {self.process.exitcode})"
            return None
        if isinstance(message, Failed):
            self.error = message.error
            return None
        return message

    def check(self) -> None:
        """Raise `TrainerFailed` if the trainer failed or is gone."""
        if self.error is None and not self.process.is_alive():
            self._next_message(0)  # its last words, if it had time to say them
            self.error = self.error or f"the trainer process ended (exit code {self.process.exitcode})"
        if self.error is not None:
            raise TrainerFailed(self.error)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the trainer (after the batches already posted) and wait for it; kill it if it hangs."""
        if self.process.is_alive() and (self._holding or self._ring.free.acquire(timeout=timeout)):
            with self.send_lock:
                self._holding = False
                self._post(self._next % self.depth, Entry.STOP, Tag.PERIODIC)
            self.process.join(timeout)
        if self.process.is_alive():
            log.warning("the trainer process did not stop within %.0f s; killing it", timeout)
            self.process.kill()
            self.process.join(5)
        for channel in (self._slots_channel, self._outbox):
            channel.cancel_join_thread()  # never block the learner's exit on a pipe nobody reads
            channel.close()


class Ring:
    """What the learner and the trainer share: per entry what it asks for (and a request's tag),
    and two counts: entries free to fill, entries posted for the trainer."""

    def __init__(self, context, depth: int) -> None:
        self.kinds = context.RawArray("b", depth)
        self.tags = context.RawArray("b", depth)
        self.free = context.Semaphore(depth)
        self.posted = context.Semaphore(0)


# -- the trainer process --------------------------------------------------------------------------
def serve(spec: TrainerSpec, ring: Ring, slots_channel, outbox, updates, idle_us, parent_pid: int) -> None:
    """The trainer process: build the algorithm, then take the ring's entries in order until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the learner, which stops us cleanly
    _own_scheduling_group()
    try:
        torch.set_num_threads(spec.threads)
        device = torch.device(spec.device)
        torch.manual_seed(spec.seed)
        algo = make_algo(
            spec.algo, spec.obs_space, spec.action_space, spec.policy, spec.policy_options, spec.settings, device
        )
        if spec.state is not None:
            algo.load_state_dict(spec.state)
        elif spec.initial_weights is not None:
            fresh = load_weights(getattr(algo, "pretrained", algo.actor), spec.initial_weights)
            log.warning(
                "the actor starts from %s%s",
                spec.initial_weights,
                f"; {len(fresh)} tensors keep their initial values ({', '.join(fresh[:3])}, ...)" if fresh else "",
            )
        if spec.rng is not None:
            torch.set_rng_state(spec.rng["torch"])
            if device.type == "cuda" and "cuda" in spec.rng:  # SAC's action noise is drawn on the GPU
                torch.cuda.set_rng_state(spec.rng["cuda"], device)
        updates.value = algo.updates
        outbox.put(Started(algo.updates))
        _train(spec, algo, device, ring, slots_channel, outbox, updates, idle_us, parent_pid)
    except BaseException as exc:  # the learner reports it and stops
        if _parent_gone(parent_pid, grace_s=0.0):
            return  # no learner to report to: what failed was talking to it
        outbox.put(Failed(f"{type(exc).__name__}: {exc}"))
        traceback.print_exc()
        raise
    finally:
        outbox.close()
        outbox.join_thread()  # the last reply (or the error) is in the pipe before the process ends


def _own_scheduling_group() -> None:
    """Start a session of our own. With the kernel's autogroup scheduling (on by default in most
    distributions) a session is a scheduling group: the trainer then gets its fair share of the
    CPU as a group against the edges, Ray and the learner's threads together, instead of being
    preempted by each of their wake-ups (measured: 280 preemptions/s and 0.93 of a core, against 36/s
    and 0.99 with 4 sims on 2 cores). Nothing changes where autogroup is off."""
    try:
        os.setsid()
    except OSError:  # already a session leader: nothing to do
        pass


def _train(
    spec: TrainerSpec,
    algo: Algorithm,
    device: torch.device,
    ring: Ring,
    slots_channel,
    outbox,
    updates,
    idle_us,
    parent_pid: int,
) -> None:
    slots: dict[str, torch.Tensor] | None = None
    metrics: dict[str, torch.Tensor] = {}
    on_gpu = device.type == "cuda"
    depth, taken = len(ring.kinds), 0
    publisher = ActorPublisher(algo, spec.weight_dtype, outbox)
    update = make_updater(algo, device, spec.cuda_graph, spec.compile)
    schedule = PublishSchedule(spec.publish_every_s, spec.publish_every_updates, spec.publish_max_bytes_per_s)
    while True:
        waited = time.perf_counter()
        if not ring.posted.acquire(timeout=PARENT_CHECK_S):
            if os.getppid() != parent_pid:  # the learner died (killed): nobody will ever stop us
                return
            continue
        if algo.updates:
            idle_us.value += int((time.perf_counter() - waited) * 1e6)
        entry = taken % depth
        taken += 1
        kind, tag = Entry(ring.kinds[entry]), Tag(ring.tags[entry])
        if kind == Entry.BATCH:
            if slots is None:
                slots = _receive_slots(slots_channel, parent_pid)
                if slots is None:  # the learner was killed meanwhile: nobody will ever stop us
                    return
            metrics = update({key: tensor[entry] for key, tensor in slots.items()})
            ring.free.release()  # on a GPU the batch is up there; on a CPU the update has read the slot
            updates.value = algo.updates
            now = time.monotonic()
            if schedule.due(algo.updates, now) and publisher.actor(Tag.PERIODIC, metrics):
                schedule.published(algo.updates, now)
                schedule.set_actor_bytes(publisher.actor_bytes)
            continue
        ring.free.release()
        if kind == Entry.ACTOR:
            if publisher.actor(tag, metrics):
                schedule.published(algo.updates, time.monotonic())
        elif kind == Entry.STATE:
            rng = {"torch": torch.get_rng_state(), **({"cuda": torch.cuda.get_rng_state(device)} if on_gpu else {})}
            state = snapshot(algo.state_dict())  # copied here, between updates; serialised by the sender
            publisher.later(
                lambda updates=algo.updates, state=state, tag=tag, rng=rng: StateSerialised(
                    tag, updates, to_bytes((state, rng))
                )
            )
        elif kind == Entry.STOP:
            publisher.close()
            return


def _receive_slots(slots_channel, parent_pid: int, timeout_s: float = 60.0) -> dict[str, torch.Tensor] | None:
    """The slots' shared tensors, which the learner sends once, with its first batch; None if the
    learner died meanwhile.

    Each tensor's memory arrives as a file descriptor that the learner's process hands over from a
    helper thread (multiprocessing's resource sharer), one Unix-socket connection per tensor. A
    learner killed while we fetch them (a kill within milliseconds of its first batch: it happened
    once in ~25 kills of a kill schedule) resets those connections: ConnectionResetError here, or
    no slots at all. That is the learner's death, not a trainer failure: exit quietly."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return slots_channel.get(timeout=PARENT_CHECK_S)
        except queue.Empty:
            if _parent_gone(parent_pid, grace_s=0.0):
                return None
            if time.monotonic() > deadline:
                raise
        except (OSError, EOFError):
            if _parent_gone(parent_pid):
                return None
            raise


def _parent_gone(parent_pid: int, grace_s: float = 2.0) -> bool:
    """Whether the learner has died. A killed process's connections are reset before its children are
    handed to a new parent, so a reset may come first: wait up to `grace_s` for the reparenting."""
    deadline = time.monotonic() + grace_s
    while os.getppid() == parent_pid:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


class ActorPublisher:
    """The trainer's outbox: the actor into a shared buffer (update thread: one copy), anything
    bigger serialised by a sender thread, every message in the order it was made."""

    def __init__(self, algo: Algorithm, weight_dtype: str, outbox) -> None:
        self.algo, self.cast, self.outbox = algo, CASTS[weight_dtype], outbox
        self.buffers: ActorBuffers | None = None
        self._queue: queue.Queue = queue.Queue()
        self._sender = threading.Thread(target=self._send, name="trainer-sender", daemon=True)
        self._sender.start()

    def actor(self, tag: Tag, metrics: dict[str, torch.Tensor]) -> bool:
        """Write the actor into a free shared buffer and send word of it; False if none was free (a
        periodic actor waits for none: the edges still fetch the last ones, a later one goes instead)."""
        if self.buffers is None:
            self.buffers = ActorBuffers(self.algo.actor, self.cast)
            self.later(lambda buffers=self.buffers: ActorBuffersMade(buffers))
        index = self.buffers.write(self.algo.actor, wait_s=0.0 if tag == Tag.PERIODIC else 60.0)
        if index is None:
            return False
        floats = metrics_to_floats(metrics)
        self.later(lambda updates=self.algo.updates: ActorWritten(tag, updates, index, floats))
        return True

    @property
    def actor_bytes(self) -> int:
        """Bytes one published version carries (its trainable part, as cast); 0 before the first."""
        return self.buffers.own_layout.total_bytes if self.buffers is not None else 0

    def later(self, make_message: Callable[[], TrainerMessage]) -> None:
        """Send what `make_message()` returns, from the sender thread, after everything before it."""
        self._queue.put(make_message)

    def _send(self) -> None:
        while (make_message := self._queue.get()) is not None:
            try:
                self.outbox.put(make_message())
            except BaseException as exc:  # the learner hears of it and stops
                self.outbox.put(Failed(f"{type(exc).__name__}: {exc}"))
                raise

    def close(self) -> None:
        """Every message made so far is in the outbox when this returns."""
        self._queue.put(None)
        self._sender.join()
