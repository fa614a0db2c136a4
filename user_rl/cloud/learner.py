"""The learner service: ingest → replay → SAC updates → weight publisher, in one loop.

The loop never waits for rollouts: each turn it drains waiting messages without blocking and
makes one gradient step. When the fleet is paced (sims in training), every ack carries a step
credit so that env steps and updates keep the configured update-to-data ratio on any machine.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from pathlib import Path

import numpy as np
import torch
import zmq

from user_rl.algos import SAC, SACSettings
from user_rl.cloud.buffer.store import NEXT_OBS
from user_rl.cloud.checkpoint import (BackgroundCheckpointer, load_checkpoint, save_checkpoint, snapshot,
                                      spaces_from_text, spaces_to_text)
from user_rl.cloud.ingest import Ingest
from user_rl.cloud.weight_server import WeightServer
from user_rl.config import Config
from user_rl.security.curve import learner_gate
from user_rl.wire.transitions import OBS

log = logging.getLogger(__name__)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Learner:
    def __init__(self, cfg: Config, run_dir: str | Path) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        threads = cfg.learner.torch_threads or max(1, (os.cpu_count() or 1) - cfg.fleet.num_robots)
        torch.set_num_threads(threads)
        self.device = pick_device(cfg.learner.device)
        self.context = zmq.Context()
        host, lc = cfg.learner.host, cfg.learner
        self.gate = learner_gate(self.context, cfg.security, host)  # None: links in the clear (loopback)
        self.ingest = Ingest(self.context, f"tcp://{host}:{lc.data_port}", self.run_dir / "buffer", cfg.buffer,
                             cfg.algo.gamma, gate=self.gate, max_messages_per_s=lc.max_messages_per_s,
                             max_message_bytes=int(lc.max_message_mb * 2**20))
        cast = torch.bfloat16 if cfg.learner.weight_dtype == "bfloat16" else None
        self.weights = WeightServer(self.context, f"tcp://{host}:{lc.weights_port}", cast, gate=self.gate)
        self.rng = np.random.default_rng(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.algo: SAC | None = None
        self.version = 0
        self.resumed_from: dict | None = None
        self.checkpoints = BackgroundCheckpointer(self.checkpoint_path)
        self._last_checkpoint = time.monotonic()
        if self.checkpoint_path.is_file():
            self._resume()
        self.steps_at_start = self.env_steps
        self.active_robots = cfg.fleet.num_robots  # fewer once a robot has failed: its share of credit moves on
        self.last_metrics: dict[str, float] = {}
        self._stop = threading.Event()
        self._pause_requested = threading.Event()
        self._paused = threading.Event()
        self._status: dict = {}
        self._started = time.monotonic()
        self._update_ingest_credit()

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    @property
    def addresses(self) -> dict[str, str]:
        return {"data": self.ingest.endpoint, "weights": self.weights.endpoint}

    def _resume(self) -> None:
        """Continue from the run's checkpoint: networks, optimisers, counters, RNG, and its buffer."""
        state = load_checkpoint(self.checkpoint_path)
        obs_space, action_space = spaces_from_text(state["spaces"])
        self.ingest.open_buffer(obs_space, action_space)
        self._ensure_algo().load_state_dict(state["algo"])
        self.version = int(state["policy_version"])
        self.rng.bit_generator.state = state["rng"]["numpy"]
        torch.set_rng_state(state["rng"]["torch"])
        if self.device.type == "cuda" and "cuda" in state["rng"]:  # SAC's action noise is drawn on the GPU
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
        self.resumed_from = {"updates": self.algo.updates, "policy_version": self.version,
                             "buffer_transitions": len(self.ingest.buffer)}
        self._publish(new_version=False)
        log.warning("resumed from %s: %s", self.checkpoint_path, self.resumed_from)

    # -- pacing ----------------------------------------------------------------------------
    @property
    def updates(self) -> int:
        return self.algo.updates if self.algo else 0

    @property
    def env_steps(self) -> int:
        """Step records stored for this run (survives learner restarts: it is counted from the buffer)."""
        return self.ingest.buffer.records if self.ingest.buffer else 0

    def _update_ingest_credit(self) -> None:
        fleet, algo = self.cfg.fleet, self.cfg.algo
        self._credit_robots = self.active_robots
        if not fleet.pace_to_learner:
            self.ingest.step_credit = self.ingest.credit_increment = 0
            return
        # Credit counts the steps of the edges started with this learner: a resumed run's
        # earlier steps (`steps_at_start`) are already in the buffer.
        allowed = algo.learning_starts + self.updates / algo.utd_ratio - self.steps_at_start
        n = max(1, self.active_robots)
        per_robot = math.ceil(max(0.0, allowed) / n) + fleet.batch_transitions
        cap = math.ceil(max(0, self.cfg.stop.max_env_steps - self.steps_at_start) / n)
        self.ingest.step_credit = max(1, min(per_robot, cap))
        # Per stream (protocol branch stand-in; the learner branch owns this): how far each edge may
        # run ahead of what is stored of its own stream, so a resumed learner cannot strand edges that
        # kept running. A fresh learner, and the end of the run (stop.max_env_steps), keep the
        # fleet-wide credit above (None: the ingest uses it).
        ahead = max(0, math.ceil((algo.learning_starts + self.updates / algo.utd_ratio - self.env_steps) / n))
        increment = ahead + fleet.batch_transitions
        left = math.ceil((self.cfg.stop.max_env_steps - self.env_steps) / n)
        self.ingest.credit_increment = increment if self.steps_at_start and increment <= left else None

    def _may_update(self) -> bool:
        buffer = self.ingest.buffer
        if self._pause_requested.is_set() or buffer is None or len(buffer) < self.cfg.algo.learning_starts:
            return False
        if not self.cfg.fleet.pace_to_learner:
            return True
        # Paced: do not run ahead of the data either (the ratio holds in both directions).
        lead = self.active_robots * self.cfg.fleet.batch_transitions * self.cfg.algo.utd_ratio
        return self.updates < self.cfg.algo.utd_ratio * (self.env_steps - self.cfg.algo.learning_starts) + lead

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> None:
        last_status = 0.0
        while not self._stop.is_set():
            busy = self._may_update()
            if self._credit_robots != self.active_robots:  # a robot failed: its share of steps moves on now
                self._update_ingest_credit()
                self.ingest.push_credit()
            self.ingest.poll(0 if busy else 5)
            self.weights.poll(0)
            if busy:
                self._train_step()
            elif self._pause_requested.is_set() and not self._paused.is_set():
                self._publish()
                self._paused.set()
            if self.algo is not None and time.monotonic() - self._last_checkpoint > self.cfg.learner.checkpoint_every_s:
                self.checkpoints.submit(self._checkpoint_payload())
                self._last_checkpoint = time.monotonic()
            if time.monotonic() - last_status > 0.5:
                self._status = self._snapshot()
                last_status = time.monotonic()
        self._status = self._snapshot()

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

    def _train_step(self) -> None:
        algo = self._ensure_algo()
        batch = self.ingest.buffer.sample(self.cfg.algo.batch_size, self.rng)
        self.last_metrics = algo.update(self._to_device(batch))
        if algo.updates == 1 or algo.updates % self.cfg.learner.publish_every_updates == 0:
            self._publish()
        if algo.updates % 8 == 0:
            self._update_ingest_credit()
            self.ingest.push_credit()

    def _to_device(self, batch: dict[str, np.ndarray]) -> dict:
        dev = self.device
        tensors = {k: torch.as_tensor(v).to(dev, non_blocking=True) for k, v in batch.items()}
        return {
            "obs": {k.removeprefix(OBS): v for k, v in tensors.items() if k.startswith(OBS)},
            "next_obs": {k.removeprefix(NEXT_OBS): v for k, v in tensors.items() if k.startswith(NEXT_OBS)},
            "action": tensors["action"],
            "reward": tensors["reward"],
            "terminated": tensors["terminated"],
            **({"discount": tensors["discount"]} if "discount" in tensors else {}),
        }

    def _publish(self, new_version: bool = True) -> None:
        if self.algo is None:
            return
        self.version += int(new_version)
        self.weights.publish(self.version, self.algo.actor.state_dict())
        self.ingest.policy_version = self.version

    # -- control from outside the loop thread ------------------------------------------------
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
        return dict(self._status)

    def _snapshot(self) -> dict:
        ingest = self.ingest.report()
        robots = ingest["robots"]
        successes = [r["recent_success"] for r in robots.values() if r["recent_success"] is not None]
        returns = [r["recent_return"] for r in robots.values() if r["recent_return"] is not None]
        return {
            "time": time.monotonic() - self._started,
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
            "checkpoint_error": self.checkpoints.last_error,
            "resumed_from": self.resumed_from,
            "metrics": dict(self.last_metrics),
        }

    # -- persistence -----------------------------------------------------------------------
    def _checkpoint_payload(self) -> dict:
        """Everything a resume needs, snapshotted now (safe to write from another thread)."""
        return {
            "format": 2,
            "config": self.cfg.model_dump(),
            "spaces": spaces_to_text(self.ingest.obs_space, self.ingest.action_space),
            "policy": {"type": self.cfg.policy.type, "options": {"hidden": self.cfg.policy.hidden}},
            "policy_version": self.version,
            "actor": snapshot(self.algo.actor.state_dict()),
            "algo": snapshot(self.algo.state_dict()),
            "env_steps": self.env_steps,
            "rng": {"numpy": snapshot(self.rng.bit_generator.state), "torch": torch.get_rng_state(),
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
        self.checkpoints.close()
        self.ingest.close()
        self.weights.close()
        if self.gate is not None:
            self.gate.close()
        self.context.term()
