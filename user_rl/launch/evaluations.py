"""The launcher's evaluations: an exact snapshot of the learner's actor, played on an eval robot of
the launcher's own, with the learner paused or beside the training.

A point of the learning curve pauses the learner only for the snapshot: the learner publishes
its actor, the evaluator takes that version's weights, and the learner and the fleet go on while
a thread of the launcher's process plays the snapshot's episodes (`stop.eval_beside_training`).
On a 2-core box the learner, the sim and the evaluation then share the cores instead of taking
turns. An evaluation that decides the run's end (the final one, and every one while a goal is
set) holds the learner until it is done, so the checkpoint the run leaves is the version it
evaluated.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import zmq

from user_rl.config import Config
from user_rl.evaluation import EvalResult, evaluate


@dataclass(frozen=True)
class Snapshot:
    """The learner's actor taken for an evaluation: its version, where the run stood, and which
    round it is (each round plays new episodes)."""

    version: int
    env_steps: int
    updates: int
    round_index: int


class Evaluator:
    """Fetches a version of the learner's actor over the weights socket and evaluates it on a robot
    of its own, in the calling thread (`evaluate`) or in its thread (`start`, then `finished`)."""

    def __init__(self, cfg: Config, weights_address: str) -> None:
        from user_rl.algos import make_run_actor
        from user_rl.edge.weights import WeightReceiver
        from user_rl.hal.registry import make_robot
        from user_rl.security.curve import launch_client_keys

        self.cfg = cfg
        self.robot = make_robot(cfg.robot.type, **{**cfg.robot_options(0), "robot_id": "eval"})
        self.actor = make_run_actor(cfg.policy, cfg.algo, self.robot.observation_space, self.robot.action_space)
        self.context = zmq.Context()
        self.receiver = WeightReceiver(
            self.context, weights_address, curve=launch_client_keys(cfg.security, weights_address)
        )
        self.rounds = 0  # evaluations started: the next one's round index
        self._thread: threading.Thread | None = None
        self._finished: queue.Queue = queue.Queue()  # (snapshot, result or the exception it raised)

    def snapshot(self, version: int, env_steps: int, updates: int) -> tuple[Snapshot, dict[str, torch.Tensor]]:
        """Version `version`'s weights (it waits for them), numbered as the next round."""
        _, state = self.receiver.wait_for(version)
        taken = Snapshot(version, env_steps, updates, self.rounds)
        self.rounds += 1
        return taken, state

    def evaluate(self, snapshot: Snapshot, state: dict[str, torch.Tensor]) -> EvalResult:
        """Play the round's episodes with `state` loaded (each round's seeds are new)."""
        self.actor.load_state_dict(state)
        seed = 1000 * self.cfg.seed + 100 + snapshot.round_index
        return evaluate(self.robot, self.actor, self.cfg.stop.eval_episodes, seed=seed)

    # -- beside the training -------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """An evaluation is running in the background."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, snapshot: Snapshot, state: dict[str, torch.Tensor], learner_updates: Callable[[], int]) -> None:
        """Evaluate in the background (one at a time: the caller waits while `busy`); at the end,
        `learner_updates()` says how far the training went meanwhile."""
        if self.busy:
            raise RuntimeError("an evaluation is still running; start the next once it has finished")

        def run() -> None:
            try:
                result = self.evaluate(snapshot, state)
                self._finished.put((snapshot, result, learner_updates()))
            except BaseException as exc:  # the launcher raises it where it collects the results
                self._finished.put((snapshot, exc, None))

        self._thread = threading.Thread(target=run, name=f"evaluation-{snapshot.round_index}", daemon=True)
        self._thread.start()

    def finished(self, wait: bool = False) -> list[tuple[Snapshot, EvalResult, int]]:
        """The background evaluations that have ended since the last call, each with the learner's
        updates as it ended (with `wait`, the running one too); an evaluation that failed raises here."""
        if wait and self._thread is not None:
            self._thread.join()
        done = []
        while True:
            try:
                snapshot, result, updates_after = self._finished.get_nowait()
            except queue.Empty:
                return done
            if isinstance(result, BaseException):
                raise RuntimeError(f"the evaluation of policy version {snapshot.version} failed: {result}") from result
            done.append((snapshot, result, updates_after))

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.receiver.close()
        self.robot.close()
        self.context.term()
