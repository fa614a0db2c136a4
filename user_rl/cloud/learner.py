"""The learner service: ingest → replay → updates (`algo.type`) → weight publisher.

- The ingest thread owns every ZeroMQ socket (sockets are not thread-safe): it stores and acks
  the edges' batches, serves weights, publishes each new actor the trainer hands back, sets
  the edges' step credit, and builds the status twice a second.
- The sampler thread keeps up to `learner.prefetch_batches` sampled batches ready in the
  trainer's shared-memory slots.
- The trainer process (`cloud/trainer.py`) steps SAC on each batch, with an interpreter of its
  own: the updates never wait for this process's GIL.
- The thread that calls `run` reads the trainer's replies (actors to publish, states to
  checkpoint), and handles pauses.

The learner owns the buffer, the step credit and the published versions, and hands the ingest
what it needs of them; what crosses between threads goes through one channel each
(`cloud/handoffs.py`): the status, the opened buffer, the actor to publish, the fleet's pacing.

The updates never wait for rollouts. When the fleet is paced (sims in training), every ack
carries a step credit so that env steps and updates keep the configured update-to-data ratio.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
import zmq

from user_rl.cloud.batches import BatchPreparer
from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.cloud.checkpoint import BackgroundCheckpointer, load_checkpoint, save_checkpoint, snapshot
from user_rl.cloud.credit import StepCredit
from user_rl.cloud.endpoints import reachable_endpoint
from user_rl.cloud.handoffs import ActorHandOff, FleetPacing, Latest, Pace
from user_rl.cloud.ingest import Ingest
from user_rl.cloud.staleness import PUBLISHED_FILE, PublishedVersions
from user_rl.cloud.threads import GuardedThread
from user_rl.cloud.trainer import ActorReply, Reply, StateReply, Tag, Trainer, TrainerFailed, TrainerSpec
from user_rl.cloud.version_lease import VersionLease
from user_rl.cloud.weight_server import WeightServer
from user_rl.config import Config
from user_rl.hal.registry import robot_spaces
from user_rl.security.curve import learner_gate
from user_rl.tensorboard_log import LearnerCurves, open_log
from user_rl.wire.spaces import spaces_from_text, spaces_to_text
from user_rl.wire.weights import CASTS, PackedWeights

log = logging.getLogger(__name__)

STATUS_EVERY_S = 0.5
INGEST_MESSAGES_PER_TURN = 16


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def describe_device(device: torch.device) -> str:
    """ "cpu (4 threads)" or "cuda:0 (NVIDIA H100 80GB HBM3)": what the first log line and the status say."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return f"{device.type} ({torch.get_num_threads()} threads)"


def credit_increment(
    learning_starts: int,
    updates: int,
    utd_ratio: float,
    env_steps: int,
    robots: int,
    batch_transitions: int,
    max_env_steps: int,
) -> int:
    """Steps each paced robot may take beyond what the learner has stored of its stream.

    The fleet may run `learning_starts + updates / utd_ratio - env_steps` steps ahead of the
    data stored now (negative while the learner is behind: then the robots wait); each robot gets
    its share plus one batch (so it can fill the batch that earns the next ack), and no more than
    its share of what is left of `max_env_steps`. The learner waits for data only once it is a
    batch per robot ahead (`_may_update`), so the fleet and the learner never both wait.
    """
    robots = max(1, robots)
    allowed = learning_starts + updates / utd_ratio - env_steps
    share = math.ceil(allowed / robots) + batch_transitions
    left = math.ceil(max(0, max_env_steps - env_steps) / robots)
    return min(share, left)


class OpenedBuffer(NamedTuple):
    """The run's buffer and the fleet's spaces, fixed together when it opens."""

    buffer: PersistentReplay
    obs_space: gym.spaces.Dict
    action_space: gym.spaces.Box


def learner_torch_threads(cfg: Config) -> int:
    """`learner.torch_threads`, or the cores the fleet's edges leave free (at least one)."""
    return cfg.learner.torch_threads or max(1, (os.cpu_count() or 1) - cfg.fleet.num_robots)


class Learner:
    def __init__(self, cfg: Config, run_dir: str | Path) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        torch.set_num_threads(learner_torch_threads(cfg))
        self.device = pick_device(cfg.learner.device)
        self.device_name = describe_device(self.device)
        self.context = zmq.Context()
        host, lc = cfg.learner.host, cfg.learner
        self.gate = learner_gate(self.context, cfg.security, host)  # None: links in the clear (loopback)
        self._opened: Latest[OpenedBuffer | None] = Latest(None)  # by the config, a checkpoint or the first hello
        self._status: Latest[dict] = Latest({})  # made on the ingest thread, read by any
        self.credit = StepCredit()  # what the acks of a paced fleet allow: set on the ingest thread
        self.ingest = Ingest(
            self.context,
            f"tcp://{host}:{lc.data_port}",
            self.run_dir / "buffer",
            cfg.run_buffer(),
            cfg.algo.gamma,
            gate=self.gate,
            max_messages_per_s=lc.max_messages_per_s,
            max_message_bytes=int(lc.max_message_mb * 2**20),
            max_robots=lc.max_robots,
            forget_idle_s=lc.forget_idle_s,
            open_buffer=self._open_buffer,
            credit=self.credit,
            # Lags count the versions earlier learners of this run published too (staleness.py)
            published=PublishedVersions(self.run_dir / PUBLISHED_FILE),
            status=self._status.get,  # answered on the ingest thread, which also makes it
            updates=lambda: self.updates,
        )
        self.weights = WeightServer(
            self.context,
            f"tcp://{host}:{lc.weights_port}",
            CASTS[lc.weight_dtype],
            gate=self.gate,
            claim_timeout_s=lc.weight_claim_timeout_s,
        )
        self.rng = np.random.default_rng(cfg.seed)
        torch.manual_seed(cfg.seed)
        self._trainer: Latest[Trainer | None] = Latest(None)  # started once the fleet's spaces are known
        self._trainer_state: StateReply | None = None  # the newest whole state it handed back (for `save`)
        self.version = 0  # the newest version published (0: none yet)
        self.resumed_from: dict | None = None
        # Updates made before the run had any online step (an offline run's, resumed with robots):
        # a paced fleet's budget of updates counts online env steps, so it leaves these out.
        self.offline_updates = 0
        self.checkpoints = BackgroundCheckpointer(self.checkpoint_path)
        self._last_checkpoint = time.monotonic()
        self._rng_lock = threading.Lock()  # the sampler draws from self.rng; a checkpoint reads its state
        self._stop = threading.Event()
        self._pause_requested = threading.Event()
        self._paused = threading.Event()
        self._to_publish = ActorHandOff()  # from the thread that reads the trainer's replies to the ingest thread
        self.last_metrics: dict[str, float] = {}  # as of the trainer's last handed-back actor
        self._pause_asked = False
        self._state_asked = False
        self._checkpoint_wanted = threading.Event()
        # The launcher's word: robots still running (fewer once one has failed: its share of credit moves on),
        # and the next evaluation point (stop.eval_every_env_steps), where a paced fleet and the updates
        # stop until it has evaluated and sets the next one
        self.pacing = FleetPacing(Pace(cfg.fleet.num_robots))
        self.lease = VersionLease(self.run_dir)
        if self.checkpoint_path.is_file():
            self._resume()
        else:
            self._open_configured_buffer()
        if cfg.offline:
            self._check_offline_data()
        self.steps_at_start = self.env_steps  # for progress rates only
        self._started = time.monotonic()
        self._credit_pushed_at = (-1, -1)  # (updates, robots) at the last push of credit to every robot
        # Push credit to every robot once each may take half a batch more: often enough that the
        # learner never runs out of paced lead (a batch per robot), rarely enough not to wake
        # every edge for a step or two (acks after each commit carry fresh credit anyway).
        fleet = cfg.fleet
        self._credit_push_every = max(1, int(fleet.num_robots * fleet.batch_transitions * cfg.algo.utd_ratio / 2))
        self._update_ingest_credit()
        self.sampler = BatchPreparer(
            lambda: self.buffer,
            lambda: self.trainer,
            cfg.algo.batch_size,
            self.rng,
            self._may_submit,
            self._stop,
            self._rng_lock,
        )
        self._threads: dict[str, GuardedThread] = {}
        self._board_thread: GuardedThread | None = None
        self._status.set(self._snapshot())  # no thread runs yet: the first status (it names the device) is ready now
        log.warning("learner trains on %s", self.device_name)

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    @property
    def addresses(self) -> dict[str, str]:
        """Where edges and tools reach this learner (bound to every interface: this machine's address)."""
        return {"data": reachable_endpoint(self.ingest.endpoint), "weights": reachable_endpoint(self.weights.endpoint)}

    @property
    def trainer(self) -> Trainer | None:
        """The trainer process's handle (None until the fleet's spaces are known); the sampler thread reads it."""
        return self._trainer.get()

    @property
    def buffer(self) -> PersistentReplay | None:
        """The run's buffer (None until the fleet's spaces are known)."""
        opened = self._opened.get()
        return opened.buffer if opened else None

    def _open_buffer(self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> PersistentReplay:
        """Open the run's buffer for these spaces (the ingest calls it: on its thread for a first hello)."""
        buffer = PersistentReplay(
            self.run_dir / "buffer", obs_space, action_space, self.cfg.run_buffer(), self.cfg.algo.gamma
        )
        self._opened.set(OpenedBuffer(buffer, obs_space, action_space))
        return buffer

    def _open_configured_buffer(self) -> None:
        """A fresh run takes the config's robot's spaces, so a stranger's hello cannot set them."""
        try:
            obs_space, action_space = robot_spaces(self.cfg.robot.type, self.cfg.robot_options(0))
        except Exception as exc:  # the driver is not installed here, or is real hardware: the first hello decides
            log.warning(
                "the learner cannot read the spaces of robot %r here (%s); the first robot's hello will "
                "fix the fleet's spaces",
                self.cfg.robot.type,
                exc,
            )
            return
        self.ingest.open_buffer(obs_space, action_space)
        self._ensure_trainer()

    def _check_offline_data(self) -> None:
        """An offline run has no hello to wait for: its spaces are the config's robot's or, where that
        driver is not installed here, the first attached buffer's; and it must have enough rows."""
        if self.buffer is None:
            from user_rl.cloud.buffer.episodes import buffer_spaces

            self.ingest.open_buffer(*buffer_spaces(self.cfg.buffer.attach[0].path))
            self._ensure_trainer()
        rows, starts = len(self.buffer), self.cfg.algo.learning_starts
        if rows < starts:
            raise ValueError(
                f"offline run: the attached buffers hold {rows:,} rows to learn from, fewer than "
                f"algo.learning_starts ({starts:,}); lower it to {rows:,} or attach more"
            )

    def _resume(self) -> None:
        """Continue from the run's checkpoint: networks, optimisers, counters, RNG, and its buffer."""
        state = load_checkpoint(self.checkpoint_path)
        obs_space, action_space = spaces_from_text(state["spaces"])
        self.ingest.open_buffer(obs_space, action_space)
        self.rng.bit_generator.state = state["rng"]["numpy"]
        rng = {key: value for key, value in state["rng"].items() if key in ("torch", "cuda")}
        trainer = self._ensure_trainer(state["algo"], rng)
        checkpoint_version = int(state["policy_version"])
        self.offline_updates = trainer.updates if self.env_steps == 0 else int(state.get("offline_updates", 0))
        self.resumed_from = {
            "updates": trainer.updates,
            "policy_version": checkpoint_version,
            "buffer_transitions": len(self.buffer),
        }
        # The checkpoint's actor may be newer than its version, and versions after it may have
        # been published before a crash: it goes out under a number never used before.
        self.lease.last = max(self.lease.last, checkpoint_version)
        self._publish_now(state["algo"]["actor"], trainer.updates)
        log.warning(
            "resumed from %s: %s; publishing its actor as policy version %d",
            self.checkpoint_path,
            self.resumed_from,
            self.version,
        )

    def _ensure_trainer(self, state: dict | None = None, rng: dict | None = None) -> Trainer | None:
        """Start the trainer process once the fleet's spaces are known (from a checkpoint's state)."""
        opened = self._opened.get()
        if self.trainer is None and opened is not None:
            cfg = self.cfg
            spec = TrainerSpec(
                opened.obs_space,
                opened.action_space,
                cfg.policy.type,
                cfg.policy.options(),
                cfg.algo,  # its algorithm's Settings
                str(self.device),
                learner_torch_threads(cfg),
                cfg.seed,
                cfg.learner.publish_every_updates,
                state,
                rng,
                algo=cfg.algo.type,
                initial_weights=cfg.policy.weights,
                weight_dtype=cfg.learner.weight_dtype,
                publish_every_s=cfg.learner.publish_every_s,
                publish_max_bytes_per_s=cfg.learner.publish_max_bytes_per_s,
                cuda_graph=cfg.learner.cuda_graph,
                compile=cfg.learner.compile,
            )
            self._trainer.set(Trainer(spec, cfg.learner.prefetch_batches))
        return self.trainer

    # -- pacing ----------------------------------------------------------------------------
    @property
    def updates(self) -> int:
        return self.trainer.updates if self.trainer else 0

    def _offline_updates_at(self, updates: int) -> int:
        """What `offline_updates` is with `updates` made: all of them while no online step is stored."""
        return self.offline_updates if self.env_steps else updates

    @property
    def online_updates(self) -> int:
        """Updates since the run's first online step: what a paced fleet's budget counts."""
        return max(0, self.updates - self.offline_updates)

    @property
    def env_steps(self) -> int:
        """Step records stored for this run (survives learner restarts: it is counted from the buffer)."""
        buffer = self.buffer
        return buffer.records if buffer else 0

    @property
    def active_robots(self) -> int:
        return self.pacing.get().active_robots

    @property
    def hold_at(self) -> int | None:
        return self.pacing.get().hold_at

    def set_active_robots(self, count: int) -> None:
        """Robots still running (from the launcher's thread): a failed one's share of credit moves on."""
        self.pacing.set_active_robots(count)

    def set_hold(self, env_steps: int | None) -> None:
        """The next evaluation point, where a paced fleet and the updates stop (None: none)."""
        self.pacing.set_hold(env_steps)

    def _update_ingest_credit(self) -> None:
        """Set the credit the next acks carry (ingest thread): per stream, see cloud/credit.py."""
        fleet, algo, credit = self.cfg.fleet, self.cfg.algo, self.credit
        if not fleet.pace_to_learner:
            credit.increment, credit.max_records = None, None
            return
        step_limit = self.step_limit
        credit.max_records = step_limit
        credit.increment = credit_increment(
            algo.learning_starts,
            self.online_updates,
            algo.utd_ratio,
            self.env_steps,
            max(1, self.active_robots),
            fleet.batch_transitions,
            step_limit,
        )

    @property
    def step_limit(self) -> int:
        """The env steps a paced fleet may reach now: the run's budget, or the next evaluation point."""
        return min(self.cfg.stop.max_env_steps, self.hold_at or self.cfg.stop.max_env_steps)

    def _may_submit(self) -> bool:
        """Whether the sampler may send the trainer one more batch (read under its `send_lock`)."""
        buffer, trainer = self.buffer, self.trainer
        if (
            self._pause_requested.is_set()
            or trainer is None
            or buffer is None
            or len(buffer) < max(1, self.cfg.algo.learning_starts)
        ):
            return False
        if self.cfg.stop.max_updates is not None and trainer.submitted >= self.cfg.stop.max_updates:
            return False
        if not self.cfg.fleet.pace_to_learner or self.cfg.offline:
            return True
        # Paced: do not run ahead of the data either (the ratio holds in both directions).
        algo, pace = self.cfg.algo, self.pacing.get()
        lead = pace.active_robots * self.cfg.fleet.batch_transitions * algo.utd_ratio
        limit = algo.utd_ratio * (self.env_steps - algo.learning_starts) + lead
        if pace.hold_at is not None:  # at an evaluation point exactly the updates its steps earn, as in a serial loop
            limit = min(limit, algo.utd_ratio * (self.step_limit - algo.learning_starts))
        return trainer.submitted - self.offline_updates < limit

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """Train until `stop()`; the ingest and sampler threads run alongside and end with it."""
        self._threads = {
            "ingest": GuardedThread("learner-ingest", self._ingest_loop),
            "sampler": GuardedThread("learner-sampler", self.sampler.run),
        }
        if self.cfg.learner.tensorboard_every_s > 0:  # beside the others, not one of them: logs never stop training
            self._board_thread = GuardedThread("learner-tensorboard", self._log_curves)
            self._board_thread.start()
        for thread in self._threads.values():
            thread.start()
        try:
            while not self._stop.is_set():
                self._raise_if_a_thread_died()
                trainer = self._ensure_trainer()
                if trainer is None:  # no hello yet: nothing to train or to publish
                    if self._pause_requested.is_set():
                        self._paused.set()
                    self._stop.wait(0.01)
                    continue
                for reply in trainer.replies(timeout=0.01):
                    self._on_reply(reply)
                if self._pause_requested.is_set() and not self._pause_asked:
                    with trainer.send_lock:  # every batch the sampler sends from now on sees the pause
                        trainer.request_actor(Tag.PAUSE)
                    self._pause_asked = True
                checkpoint_due = time.monotonic() - self._last_checkpoint > self.cfg.learner.checkpoint_every_s
                if (checkpoint_due or self._checkpoint_wanted.is_set()) and not self._state_asked:
                    self._checkpoint_wanted.clear()
                    with trainer.send_lock:
                        trainer.request_state(Tag.CHECKPOINT)
                    self._state_asked = True
        except TrainerFailed as exc:
            raise RuntimeError(f"the learner's trainer process stopped: {exc}") from None
        finally:
            self._stop.set()
            for thread in self._threads.values():
                thread.join(timeout=30)
            self._stop_trainer()
            if not self._threads["ingest"].is_alive():  # its sockets and counters are ours now
                self._publish_pending()
                self._status.set(self._snapshot())
            if self._board_thread is not None:  # it writes a last point and closes its file
                self._board_thread.join(timeout=30)

    def _on_reply(self, reply: Reply) -> None:
        if isinstance(reply, ActorReply):
            if reply.metrics:
                self.last_metrics = reply.metrics
            pause = reply.tag == Tag.PAUSE
            self._publish(
                self.weights.checksummed(reply.weights), reply.updates, wait=pause
            )  # not on the ingest thread
            if pause:
                self._paused.set()
        else:
            self._trainer_state = reply
            if reply.tag == Tag.CHECKPOINT:
                self.checkpoints.submit(self._checkpoint_payload(reply))
                self._last_checkpoint = time.monotonic()
                self._state_asked = False

    def _stop_trainer(self) -> None:
        """Take the trainer's final state (for `save`), then stop it. Every batch sent is trained on."""
        trainer = self.trainer
        if trainer is None or not trainer.process.is_alive():
            return
        try:
            with trainer.send_lock:
                trainer.request_state(Tag.FINAL)
            self._trainer_state = trainer.wait_for_state(Tag.FINAL, timeout=120)
        except TrainerFailed as exc:
            log.error("no final state from the trainer: %s", exc)
        trainer.close()

    def _raise_if_a_thread_died(self) -> None:
        for name, thread in self._threads.items():
            if not thread.is_alive():
                raise RuntimeError(f"the learner's {name} thread stopped: {thread.error or 'no error recorded'}")
        if self.trainer is not None:
            self.trainer.check()

    def _publish(self, actor: PackedWeights, updates: int, wait: bool = False) -> None:
        """Hand the actor's weights (after `updates` updates) to the ingest thread, which publishes them
        under a new version."""
        request = self._to_publish.offer(actor, updates)
        if wait:
            self._to_publish.wait_published(
                request, lambda: not self._stop.is_set() and self._threads["ingest"].is_alive()
            )

    def _publish_now(self, state: dict | PackedWeights, updates: int) -> None:
        """Publish under a fresh version, reserved on disk first (ingest thread, or before it starts)."""
        version = self.lease.next()
        self.ingest.publish(
            version, updates
        )  # recorded first: a crash in between counts one version too many, not too few
        self.weights.publish(version, state)
        self.version = version

    # -- the ingest thread -----------------------------------------------------------------
    def _ingest_loop(self) -> None:
        last_status = 0.0
        sockets = zmq.Poller()
        sockets.register(self.ingest.socket, zmq.POLLIN)
        sockets.register(self.weights.socket, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(sockets.poll(5))
            if self.ingest.socket in ready:
                self.ingest.poll(0, max_messages=INGEST_MESSAGES_PER_TURN)
            self.ingest.maybe_commit()
            self.weights.poll(0)  # also when no request came: hands back buffers whose frames left
            self._publish_pending()
            self._update_ingest_credit()
            pushed_updates, pushed_robots = self._credit_pushed_at
            if self.active_robots != pushed_robots or self.updates - pushed_updates >= self._credit_push_every:
                self.ingest.push_credit()  # a robot waiting for credit sends nothing, so it hears it here
                self._credit_pushed_at = (self.updates, self.active_robots)
            if time.monotonic() - last_status > STATUS_EVERY_S:
                self._status.set(self._snapshot())
                last_status = time.monotonic()
        self._publish_pending()

    def _publish_pending(self) -> None:
        pending = self._to_publish.take()
        if pending is None:
            return
        request, actor, updates = pending
        self._publish_now(actor, updates)
        self._to_publish.published(request)

    def _log_curves(self) -> None:
        """The tensorboard thread: a point from the status every `learner.tensorboard_every_s`, and a last one.
        It opens the log itself: importing TensorBoard takes seconds that the learner's start must not wait."""
        board = open_log(self.run_dir)
        if board is None:
            return
        curves = LearnerCurves(board)
        try:
            while not self._stop.wait(self.cfg.learner.tensorboard_every_s):
                curves.write(self.status())
            curves.write(self.status())
        finally:
            board.close()

    # -- control from outside the loop threads ----------------------------------------------
    def pause(self, timeout: float = 30.0) -> int:
        """Stop updating, publish the current actor, and return its version."""
        self._paused.clear()
        self._pause_requested.set()
        if not self._paused.wait(timeout):
            raise TimeoutError("learner did not pause in time")
        return self.version

    def checkpoint_now(self, timeout: float = 60.0) -> None:
        """Write a checkpoint now and return once it is on disk (while `run` runs)."""
        written = self.checkpoints.written
        self._checkpoint_wanted.set()
        deadline = time.monotonic() + timeout
        while self.checkpoints.written <= written:
            if time.monotonic() > deadline or self.checkpoints.error:
                raise TimeoutError(
                    f"no checkpoint written within {timeout:.0f} s: {self.checkpoints.error or 'no error'}"
                )
            time.sleep(0.01)

    def resume(self) -> None:
        self._pause_requested.clear()
        self._paused.clear()
        self._pause_asked = False

    def stop(self) -> None:
        self._stop.set()

    def status(self) -> dict:
        status = self._status.get()
        return {**status, "errors": {**status.get("errors", {}), **self._thread_errors()}}

    def _thread_errors(self) -> dict[str, str]:
        """Every background thread (and the trainer process) that stopped on an error or is failing, with why."""
        errors = {name: thread.error for name, thread in self._threads.items() if thread.error}
        if self._board_thread is not None and self._board_thread.error:
            errors["tensorboard"] = self._board_thread.error
        if self.trainer is not None and self.trainer.error:
            errors["trainer"] = self.trainer.error
        if self.checkpoints.error:
            errors["checkpointer"] = self.checkpoints.error
        return errors

    def _snapshot(self) -> dict:
        """The status (ingest thread: the ingest's state is read only there)."""
        ingest, buffer = self.ingest.report(), self.buffer
        buffer_errors = buffer.thread_errors() if buffer else {}
        robots = ingest["robots"]
        successes = [r["recent_success"] for r in robots.values() if r["recent_success"] is not None]
        returns = [r["recent_return"] for r in robots.values() if r["recent_return"] is not None]
        return {
            "time": time.monotonic() - self._started,
            "device": self.device_name,
            "env_steps": self.env_steps,
            "steps_at_start": self.steps_at_start,
            "active_robots": self.active_robots,
            "updates": self.updates,
            "offline_updates": self._offline_updates_at(self.updates),
            "trainer_ready": self.trainer is not None,  # it starts once the first hello names the spaces
            "policy_version": self.version,
            "buffer": len(buffer) if buffer else 0,
            "recent_success": float(np.mean(successes)) if successes else None,
            "recent_return": float(np.mean(returns)) if returns else None,
            # of the robots' recent stored steps, the share on which a person or the scripted intervener acted
            "intervention_rate": float(np.mean([r["intervention_rate"] for r in robots.values()])) if robots else 0.0,
            **ingest,
            "checkpoints_written": self.checkpoints.written,
            "checkpoint_error": self.checkpoints.error,
            "resumed_from": self.resumed_from,
            "metrics": self.last_metrics,
            # the trainer with no batch (any cause); the sampler held back by the pacing or a pause
            "update_waits_s": {
                "trainer_idle": round(self.trainer.idle_s if self.trainer else 0.0, 2),
                "held_back": round(self.sampler.held_back_s, 2),
            },
            "errors": {
                **{f"buffer {name}": error for name, error in buffer_errors.items()},
                **({"storage": ingest["failure"]} if ingest.get("failure") else {}),
            },
        }

    # -- persistence -----------------------------------------------------------------------
    def _checkpoint_payload(self, trainer_state: StateReply) -> dict:
        """Everything a resume needs: the trainer's state and RNG, the sampler's RNG now, the counters."""
        with self._rng_lock:  # the sampler draws from this RNG
            rng_state = snapshot(self.rng.bit_generator.state)
        opened = self._opened.get()  # a trainer's state implies an opened buffer
        return {
            "format": 2,
            "config": self.cfg.public_dump(),  # never a secret: checkpoints get copied around
            "spaces": spaces_to_text(opened.obs_space, opened.action_space),
            "policy": {"type": self.cfg.policy.type, "options": self.cfg.policy.options()},
            "policy_version": self.version,
            "actor": trainer_state.state["actor"],
            "algo": trainer_state.state,
            "env_steps": self.env_steps,
            "offline_updates": self._offline_updates_at(trainer_state.updates),
            "rng": {"numpy": rng_state, **(trainer_state.rng or {})},
        }

    def save(self, path: Path | None = None) -> Path | None:
        """Write the final checkpoint (call after the loop has ended)."""
        if self._trainer_state is None:  # never trained, or the trainer failed before any state came back
            return None
        self.checkpoints.close()
        path = path or self.checkpoint_path
        save_checkpoint(path, self._checkpoint_payload(self._trainer_state))
        return path

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads.values():  # only they touch the sockets: they end before the sockets close
            thread.join(timeout=30)
        self._stop_trainer()  # run() was never called, or did not end: the trainer still runs
        self.checkpoints.close()
        self.lease.release()  # a clean stop gives back the unused reserved versions
        self.ingest.close()  # the ingest thread has ended: nothing writes to the buffer any more
        buffer = self.buffer
        if buffer is not None:
            buffer.close()  # sealed: the directory holds everything acked (a failed one writes nothing more)
        self.weights.close()
        if self.gate is not None:
            self.gate.close()
        self.context.term()
