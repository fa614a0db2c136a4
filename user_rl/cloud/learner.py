"""The learner service: ingest → replay → SAC updates → weight publisher, in three threads.

- The ingest thread owns every ZeroMQ socket (sockets are not thread-safe): it stores and acks
  the edges' batches, serves weights, publishes each new actor the update thread hands it, sets
  the edges' step credit, and builds the status twice a second.
- The sampler thread keeps `learner.prefetch_batches` batches ready as tensors on the device.
- The update thread (the one that calls `run`) pops a batch and steps SAC; nothing else.

The updates never wait for rollouts. When the fleet is paced (sims in training), every ack
carries a step credit so that env steps and updates keep the configured update-to-data ratio.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import zmq

from user_rl.algos import SAC, SACSettings, metrics_to_floats
from user_rl.cloud.batches import BatchPreparer
from user_rl.cloud.checkpoint import (BackgroundCheckpointer, load_checkpoint, save_checkpoint, snapshot,
                                      spaces_from_text, spaces_to_text)
from user_rl.cloud.ingest import Ingest
from user_rl.cloud.threads import GuardedThread
from user_rl.cloud.version_lease import VersionLease
from user_rl.cloud.weight_server import WeightServer
from user_rl.config import Config
from user_rl.hal.registry import robot_spaces
from user_rl.security.curve import learner_gate

log = logging.getLogger(__name__)

STATUS_EVERY_S = 0.5
INGEST_MESSAGES_PER_TURN = 16
GIL_SWITCH_INTERVAL_S = 0.0005  # the update thread gets the GIL back soon after the ingest or sampler took it


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def describe_device(device: torch.device) -> str:
    """"cpu (4 threads)" or "cuda:0 (NVIDIA H100 80GB HBM3)": what the first log line and the status say."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return f"{device.type} ({torch.get_num_threads()} threads)"


def credit_increment(learning_starts: int, updates: int, utd_ratio: float, env_steps: int, robots: int,
                     batch_transitions: int, max_env_steps: int) -> int:
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
        self.ingest = Ingest(self.context, f"tcp://{host}:{lc.data_port}", self.run_dir / "buffer", cfg.buffer,
                             cfg.algo.gamma, gate=self.gate, max_messages_per_s=lc.max_messages_per_s,
                             max_message_bytes=int(lc.max_message_mb * 2**20), max_robots=lc.max_robots,
                             forget_idle_s=lc.forget_idle_s)
        cast = torch.bfloat16 if cfg.learner.weight_dtype == "bfloat16" else None
        self.weights = WeightServer(self.context, f"tcp://{host}:{lc.weights_port}", cast, gate=self.gate)
        self.rng = np.random.default_rng(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.algo: SAC | None = None
        self.version = 0  # the newest version published (0: none yet)
        self.resumed_from: dict | None = None
        self.checkpoints = BackgroundCheckpointer(self.checkpoint_path)
        self._last_checkpoint = time.monotonic()
        self._rng_lock = threading.Lock()  # the sampler draws from self.rng; a checkpoint reads its state
        self._stop = threading.Event()
        self._pause_requested = threading.Event()
        self._paused = threading.Event()
        self._publish_cond = threading.Condition()
        self._to_publish: tuple[int, dict] | None = None  # (request number, actor snapshot) for the ingest thread
        self._requested = self._published = 0
        self.last_metrics: dict[str, torch.Tensor] = {}
        self.waited_s = {"batch": 0.0, "data": 0.0}  # update thread idle after learning starts: sampler behind / paced fleet
        self.active_robots = cfg.fleet.num_robots  # fewer once a robot has failed: its share of credit moves on
        self.lease = VersionLease(self.run_dir)
        if self.checkpoint_path.is_file():
            self._resume()
        else:
            self._open_configured_buffer()
        self.steps_at_start = self.env_steps  # for progress rates only
        self._status: dict = {}
        self._started = time.monotonic()
        self._credit_pushed_at = (-1, -1)  # (updates, robots) at the last push of credit to every robot
        # Push credit to every robot once each may take half a batch more: often enough that the
        # learner never runs out of paced lead (a batch per robot), rarely enough not to wake
        # every edge for a step or two (acks after each commit carry fresh credit anyway).
        fleet = cfg.fleet
        self._credit_push_every = max(1, int(fleet.num_robots * fleet.batch_transitions * cfg.algo.utd_ratio / 2))
        self._update_ingest_credit()
        self.sampler = BatchPreparer(lambda: self.ingest.buffer, cfg.algo.batch_size, cfg.algo.learning_starts,
                                     self.rng, self.device, lc.prefetch_batches, self._stop, self._rng_lock)
        self._threads: dict[str, GuardedThread] = {}
        self._status = self._snapshot()  # no thread runs yet: the first status (it names the device) is ready now
        log.warning("learner trains on %s", self.device_name)

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    @property
    def addresses(self) -> dict[str, str]:
        return {"data": self.ingest.endpoint, "weights": self.weights.endpoint}

    def _open_configured_buffer(self) -> None:
        """A fresh run takes the config's robot's spaces, so a stranger's hello cannot set them."""
        try:
            obs_space, action_space = robot_spaces(self.cfg.robot.type, self.cfg.robot_options(0))
        except Exception as exc:  # the driver is not installed here, or is real hardware: the first hello decides
            log.warning("the learner cannot read the spaces of robot %r here (%s); the first robot's hello will "
                        "fix the fleet's spaces", self.cfg.robot.type, exc)
            return
        self.ingest.open_buffer(obs_space, action_space)
        self._ensure_algo()

    def _resume(self) -> None:
        """Continue from the run's checkpoint: networks, optimisers, counters, RNG, and its buffer."""
        state = load_checkpoint(self.checkpoint_path)
        obs_space, action_space = spaces_from_text(state["spaces"])
        self.ingest.open_buffer(obs_space, action_space)
        self._ensure_algo().load_state_dict(state["algo"])
        self.rng.bit_generator.state = state["rng"]["numpy"]
        torch.set_rng_state(state["rng"]["torch"])
        if self.device.type == "cuda" and "cuda" in state["rng"]:  # SAC's action noise is drawn on the GPU
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
        checkpoint_version = int(state["policy_version"])
        self.resumed_from = {"updates": self.algo.updates, "policy_version": checkpoint_version,
                             "buffer_transitions": len(self.ingest.buffer)}
        # The checkpoint's actor may be newer than its version, and versions after it may have
        # been published before a crash: it goes out under a number never used before.
        self.lease.last = max(self.lease.last, checkpoint_version)
        self._publish_now(snapshot(self.algo.actor.state_dict()))
        log.warning("resumed from %s: %s; publishing its actor as policy version %d",
                    self.checkpoint_path, self.resumed_from, self.version)

    # -- pacing ----------------------------------------------------------------------------
    @property
    def updates(self) -> int:
        return self.algo.updates if self.algo else 0

    @property
    def env_steps(self) -> int:
        """Step records stored for this run (survives learner restarts: it is counted from the buffer)."""
        return self.ingest.buffer.records if self.ingest.buffer else 0

    def _update_ingest_credit(self) -> None:
        """Set the credit the next acks carry (ingest thread): per stream, see cloud/credit.py."""
        fleet, algo, credit = self.cfg.fleet, self.cfg.algo, self.ingest.credit
        if not fleet.pace_to_learner:
            credit.increment, credit.max_records = None, None
            return
        credit.max_records = self.cfg.stop.max_env_steps
        credit.increment = credit_increment(
            algo.learning_starts, self.updates, algo.utd_ratio, self.env_steps, max(1, self.active_robots),
            fleet.batch_transitions, self.cfg.stop.max_env_steps)

    def _may_update(self) -> bool:
        buffer = self.ingest.buffer
        if self._pause_requested.is_set() or buffer is None or len(buffer) < self.cfg.algo.learning_starts:
            return False
        if not self.cfg.fleet.pace_to_learner:
            return True
        # Paced: do not run ahead of the data either (the ratio holds in both directions).
        lead = self.active_robots * self.cfg.fleet.batch_transitions * self.cfg.algo.utd_ratio
        return self.updates < self.cfg.algo.utd_ratio * (self.env_steps - self.cfg.algo.learning_starts) + lead

    # -- the update thread -----------------------------------------------------------------
    def run(self) -> None:
        """Train until `stop()`; the ingest and sampler threads run alongside and end with it."""
        # The update thread drops the GIL inside every backward pass; with the default 5 ms switch
        # interval it can then wait that long for the sampler or the ingest to give it back.
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self._threads = {"ingest": GuardedThread("learner-ingest", self._ingest_loop),
                         "sampler": GuardedThread("learner-sampler", self.sampler.run)}
        for thread in self._threads.values():
            thread.start()
        try:
            while not self._stop.is_set():
                self._raise_if_a_thread_died()
                if self._may_update():
                    batch = self.sampler.take_now()
                    if batch is None:  # the sampler is behind: the update thread waits (counted)
                        waited = time.perf_counter()
                        batch = self.sampler.take(timeout=0.05)
                        self.waited_s["batch"] += time.perf_counter() - waited
                    if batch is not None:
                        self._train_step(batch)
                elif self._pause_requested.is_set() and not self._paused.is_set():
                    self._publish(wait=True)
                    self._paused.set()
                else:
                    waited = time.perf_counter()
                    self._stop.wait(0.002)
                    if self._learning_started():  # waiting for data the paced fleet has not sent yet
                        self.waited_s["data"] += time.perf_counter() - waited
                if self.algo is not None and time.monotonic() - self._last_checkpoint > self.cfg.learner.checkpoint_every_s:
                    self.checkpoints.submit(self._checkpoint_payload())
                    self._last_checkpoint = time.monotonic()
        finally:
            self._stop.set()
            for thread in self._threads.values():
                thread.join(timeout=30)
            if not self._threads["ingest"].is_alive():  # its sockets and counters are ours now
                self._status = self._snapshot()

    def _learning_started(self) -> bool:
        buffer = self.ingest.buffer
        return buffer is not None and len(buffer) >= self.cfg.algo.learning_starts and not self._pause_requested.is_set()

    def _raise_if_a_thread_died(self) -> None:
        for name, thread in self._threads.items():
            if not thread.is_alive():
                raise RuntimeError(f"the learner's {name} thread stopped: {thread.error or 'no error recorded'}")

    def _ensure_algo(self) -> SAC:
        if self.algo is None:
            cfg = self.cfg
            settings = SACSettings(
                gamma=cfg.algo.gamma, tau=cfg.algo.tau, actor_lr=cfg.algo.actor_lr,
                critic_lr=cfg.algo.critic_lr, init_alpha=cfg.algo.init_alpha,
                target_entropy_scale=cfg.algo.target_entropy_scale,
            )
            self.algo = SAC(
                self.ingest.obs_space, self.ingest.action_space, cfg.policy.type,
                {"hidden": cfg.policy.hidden}, settings, self.device,
            )
        return self.algo

    def _train_step(self, batch: dict) -> None:
        algo = self._ensure_algo()
        self.last_metrics = algo.update(batch)  # device tensors: read only when the status is built
        if algo.updates == 1 or algo.updates % self.cfg.learner.publish_every_updates == 0:
            self._publish()

    def _publish(self, wait: bool = False) -> None:
        """Hand a snapshot of the actor to the ingest thread, which publishes it under a new version."""
        if self.algo is None and self.ingest.obs_space is not None:
            self._ensure_algo()
        if self.algo is None:
            return
        state = snapshot(self.algo.actor.state_dict())
        with self._publish_cond:
            self._requested += 1
            self._to_publish = (self._requested, state)
            if wait:
                request = self._requested
                while self._published < request and not self._stop.is_set() and self._threads["ingest"].is_alive():
                    self._publish_cond.wait(0.1)

    def _publish_now(self, state: dict) -> None:
        """Publish under a fresh version, reserved on disk first (ingest thread, or before it starts)."""
        version = self.lease.next()
        self.weights.publish(version, state)
        self.ingest.policy_version = self.version = version

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
            if self.weights.socket in ready:
                self.weights.poll(0)
            self._publish_pending()
            self._update_ingest_credit()
            pushed_updates, pushed_robots = self._credit_pushed_at
            if self.active_robots != pushed_robots or self.updates - pushed_updates >= self._credit_push_every:
                self.ingest.push_credit()  # a robot waiting for credit sends nothing, so it hears it here
                self._credit_pushed_at = (self.updates, self.active_robots)
            if time.monotonic() - last_status > STATUS_EVERY_S:
                self._status = self._snapshot()
                last_status = time.monotonic()
        self._publish_pending()

    def _publish_pending(self) -> None:
        with self._publish_cond:
            pending, self._to_publish = self._to_publish, None
        if pending is None:
            return
        request, state = pending
        self._publish_now(state)
        with self._publish_cond:
            self._published = request
            self._publish_cond.notify_all()

    # -- control from outside the loop threads ----------------------------------------------
    def pause(self, timeout: float = 30.0) -> int:
        """Stop updating, publish the current actor, and return its version."""
        self._paused.clear()
        self._pause_requested.set()
        if not self._paused.wait(timeout):
            raise TimeoutError("learner did not pause in time")
        return self.version

    def resume(self) -> None:
        self._pause_requested.clear()
        self._paused.clear()

    def stop(self) -> None:
        self._stop.set()

    def status(self) -> dict:
        return {**self._status, "errors": {**self._status.get("errors", {}), **self._thread_errors()}}

    def _thread_errors(self) -> dict[str, str]:
        """Every background thread that stopped on an error or is failing, with why."""
        errors = {name: thread.error for name, thread in self._threads.items() if thread.error}
        if self.checkpoints.error:
            errors["checkpointer"] = self.checkpoints.error
        return errors

    def _snapshot(self) -> dict:
        """The status (ingest thread: the ingest's state is read only there)."""
        ingest = self.ingest.report()
        buffer_errors = self.ingest.buffer.thread_errors() if self.ingest.buffer else {}
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
            "policy_version": self.version,
            "buffer": len(self.ingest.buffer) if self.ingest.buffer else 0,
            "recent_success": float(np.mean(successes)) if successes else None,
            "recent_return": float(np.mean(returns)) if returns else None,
            **ingest,
            "checkpoints_written": self.checkpoints.written,
            "checkpoint_error": self.checkpoints.error,
            "resumed_from": self.resumed_from,
            "metrics": metrics_to_floats(self.last_metrics),
            "update_waits_s": {why: round(seconds, 2) for why, seconds in self.waited_s.items()},
            "errors": {**{f"buffer {name}": error for name, error in buffer_errors.items()},
                       **({"storage": ingest["failure"]} if ingest.get("failure") else {})},
        }

    # -- persistence -----------------------------------------------------------------------
    def _checkpoint_payload(self) -> dict:
        """Everything a resume needs, snapshotted now (safe to write from another thread)."""
        with self._rng_lock:  # the sampler draws from this RNG
            rng_state = snapshot(self.rng.bit_generator.state)
        return {
            "format": 2,
            "config": self.cfg.model_dump(),
            "spaces": spaces_to_text(self.ingest.obs_space, self.ingest.action_space),
            "policy": {"type": self.cfg.policy.type, "options": {"hidden": self.cfg.policy.hidden}},
            "policy_version": self.version,
            "actor": snapshot(self.algo.actor.state_dict()),
            "algo": snapshot(self.algo.state_dict()),
            "env_steps": self.env_steps,
            "rng": {"numpy": rng_state, "torch": torch.get_rng_state(),
                    **({"cuda": torch.cuda.get_rng_state(self.device)} if self.device.type == "cuda" else {})},
        }

    def save(self, path: Path | None = None) -> Path | None:
        """Write the final checkpoint (call after the loop has ended)."""
        if self.algo is None:
            return None
        self.checkpoints.close()
        path = path or self.checkpoint_path
        save_checkpoint(path, self._checkpoint_payload())
        return path

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads.values():  # only they touch the sockets: they end before the sockets close
            thread.join(timeout=30)
        self.checkpoints.close()
        self.lease.release()  # a clean stop gives back the unused reserved versions
        self.ingest.close()
        self.weights.close()
        if self.gate is not None:
            self.gate.close()
        self.context.term()
