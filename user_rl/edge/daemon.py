"""The edge daemon: one robot's control loop with local policy inference.

Each turn: hand new weights to the policy runner if any arrived, pick an action (random until
the first policy version arrives, or the actor's own weights if it was built from local ones, as
a LeRobot policy's directory is: version 0; a chunk policy's next chunk is inferred in the background while
the current one runs, `AsyncChunkRunner`, so the loop does not wait on inference; an actor without
chunks infers in the loop, `ChunkRunner`), pass it through the safety filter, step the
robot, record the transition, and service the link (flush batches, heartbeats, acks). The
link is never waited on, except by a sim paced to the learner's update rate (a real robot is
never paced).

Calls to the robot (reset, step, hold) never overlap: one lock serialises them, and the
watchdog's hold waits for it only `safety.hold_wait_s`. An e-stop or a watchdog hold ends the
episode (the learner stores it as truncated, `end_reason` "estop" / "hold") and the robot starts
a new one with `reset()` once it may move again, so no transition spans a stop.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import zmq
from torch import nn

from user_rl.edge.adapt import BacklogAdapter
from user_rl.edge.batching import BatchBuilder
from user_rl.edge.health import EdgeHealth
from user_rl.edge.inference import AsyncChunkRunner
from user_rl.edge.intervention import InterventionMux, StepView
from user_rl.edge.jitter import LoopJitter, prepare_control_loop_process
from user_rl.edge.link import DataLink, LinkSettings
from user_rl.edge.obs_check import END_REASON, ObservationCheck
from user_rl.edge.operator import OperatorRequests, StepRecord
from user_rl.edge.weights import WeightReceiver
from user_rl.hal.robot import Robot, StepResult
from user_rl.policies.chunking import ChunkRunner, chunk_length
from user_rl.rewards import EnvReward, RewardedStep, StepReward
from user_rl.robots.estop import LATCH_NAME, EStopLatch
from user_rl.robots.safety import ActionFilter, HoldBlocked, SafetySettings, Watchdog
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import message_fields

log = logging.getLogger(__name__)
# Heartbeat fields filled only as a heartbeat leaves (health needs a probe of the robot, on the control loop)
SENT_ONLY = frozenset({"time", "leaving", "health", "last_error"})


class RobotRefused(RuntimeError):
    """The learner will never take this robot's data (e.g. its spaces differ from the run's policy)."""


@dataclass
class EdgeSettings:
    control_hz: float = 0.0  # 0: as fast as the robot steps (sims in training)
    pace_to_learner: bool = False  # sims only (refused for a real robot): wait for step credit from the learner
    batch_transitions: int = 64
    max_batch_delay_s: float = 0.1
    heartbeat_s: float = 1.0
    seed: int = 0
    link: LinkSettings = field(default_factory=LinkSettings)
    adapt: bool = True  # grow batches / compress harder while the backlog grows
    safety: SafetySettings = field(default_factory=SafetySettings)
    async_chunks: bool = True  # a chunk policy infers its next chunk while the current one runs
    device: str = "cpu"  # where the policy runs ("cuda" on a controller with a GPU)
    apply_weights: str = "chunk"  # new weights take over between two chunks, or only between episodes


class EdgeDaemon:
    def __init__(
        self,
        robot: Robot,
        actor: nn.Module,
        data_address: str,
        weights_address: str,
        settings: EdgeSettings | None = None,
        context: zmq.Context | None = None,
        interventions: InterventionMux | None = None,
        reward: StepReward | None = None,
        requests: OperatorRequests | None = None,
    ) -> None:
        self.robot = robot
        self.actor = actor.eval()
        self.settings = s = settings or EdgeSettings()
        period = 1.0 / s.control_hz if s.control_hz > 0 else 0.0
        # The policy's actions, one chunk inference per H steps: in the background while a chunk runs
        # when the loop keeps a clock (a sim stepped as fast as it goes waits for the policy anyway).
        ahead = s.async_chunks and chunk_length(actor) > 1 and period > 0
        self.chunks: ChunkRunner | AsyncChunkRunner = (
            AsyncChunkRunner(self.actor, device=s.device, period_s=period if ahead else None)
            if ahead or s.device != "cpu"
            else ChunkRunner(self.actor)
        )
        self.jitter = LoopJitter(period)
        if s.pace_to_learner and robot.device_kind == "robot":
            raise ValueError(
                f"{robot.descriptor.id}: pace_to_learner is for simulators; a real robot never waits for the learner"
            )
        self.context = context or zmq.Context.instance()
        self.link = DataLink(
            self.context, data_address, robot.descriptor, robot.observation_space, robot.action_space, settings=s.link
        )
        self.weights = WeightReceiver(self.context, weights_address, curve=s.link.curve)
        self.batch = BatchBuilder(robot.observation_space, robot.action_space, s.batch_transitions)
        self.adapter = BacklogAdapter(s.batch_transitions, s.link.compression or {}, s.link.max_in_flight)
        self.safety = ActionFilter(robot.action_space, s.safety, robot, s.control_hz)
        self._robot_lock = threading.Lock()  # one call to the robot at a time: reset, step, hold
        self._held = False  # the robot was held since its last step: that episode is over
        self._answers = 0  # robot calls that returned
        self.watchdog = Watchdog(
            s.safety.deadline_s, self._hold_unless_answered, self._on_hold, name=robot.descriptor.id
        )
        self.estop = EStopLatch(self.link.spool.directory / LATCH_NAME)  # next to the spool: survives restarts
        self.estops = 0
        self.observations = ObservationCheck(robot.descriptor.id)  # NaN / inf observations end episodes
        self.health = EdgeHealth(
            robot,
            self.estop.tripped,
            lambda: self.link.refused,
            {
                "learner rejected": lambda: self.link.last_reject,
                "link": lambda: self.link.handshake_error,
                "hold failed": lambda: self.watchdog.last_failure,
                "weights": lambda: self.weights.error,
                "observation": lambda: self.observations.error,
            },
        )
        self.rng = np.random.default_rng(s.seed)
        # an actor built from local weights (`pretrained`) acts with them, as version 0, until the learner's
        # first version arrives; any other acts randomly (warm-up) until then
        self.policy_version = 0 if getattr(actor, "pretrained", False) else -1
        self.steps = 0
        self.episodes = 0  # episodes ended; also the number of the one in progress
        self._episode_step = 0
        self._batch_started = 0.0
        self._last_heartbeat = 0.0
        self._rate_window = (time.monotonic(), 0)
        self.steps_per_second = 0.0
        self._stop = threading.Event()
        self.interventions = interventions or InterventionMux()  # who may act instead of the policy
        self.requests = requests or OperatorRequests()  # labels and resets asked for by people
        self.reward = reward or EnvReward()  # what each row records as its reward (user_rl/rewards/)
        self.step_watchers: list[Callable[[StepRecord], None]] = []  # called by the loop after each step
        self._robot_since: float | None = None  # inside a robot call (reset / step) since then
        self.teleop = None  # the robot's teleop page (user_rl/edge/teleop), when configured; closed with the daemon

    # -- policy ------------------------------------------------------------------------------
    def _maybe_swap_weights(self) -> None:
        """Hand a newly arrived version to the runner: at once (it loads it between two chunks), or
        only as an episode starts (`apply_weights: episode`: one policy per episode)."""
        if self.settings.apply_weights == "episode" and self._episode_step > 0:
            return  # the receiver keeps the newest version until then
        new = self.weights.poll_new()
        if new is not None:
            version, state = new
            self.chunks.swap(state, version)  # the async runner loads it between two inferences, off this loop
            self.policy_version = version

    @property
    def acting_version(self) -> int:
        """The version whose chunk the robot runs now: the newest one handed over only takes over with
        the next chunk. (-1: random warm-up; weights put into the actor directly count as the newest.)"""
        return self.chunks.version if self.chunks.version >= 0 else self.policy_version

    def _choose_action(self, obs: dict[str, np.ndarray]) -> tuple[np.ndarray, int, np.ndarray, int]:
        """(action, who chose it, the policy's proposal, its index in its chunk). The policy proposes
        on every step (random warm-up actions until its first version arrives); an intervention
        source may act instead, and then the policy's chunk is dropped: it was planned for a state
        the robot has left. (Whether that source's person held nothing: `interventions.idle`.)"""
        if self.policy_version < 0:
            proposal, chunk_step = self.robot.action_space.sample().astype(self.robot.action_space.dtype), 0
        else:
            proposal, chunk_step = self.chunks(obs)
        view = StepView(obs, proposal, self.episodes, self._episode_step)
        action, actor = self.interventions.choose(view)
        if actor != pb.ACTOR_POLICY:
            self.chunks.restart()
        elif self.policy_version < 0:
            actor = pb.ACTOR_WARMUP
        return action, actor, proposal, chunk_step

    # -- link ---------------------------------------------------------------------------------
    def _flush(self) -> None:
        if self.batch.count:
            taken = self.batch.take_batch()
            self.link.send_batch(taken.count, taken.columns, taken.people)
            if self.settings.adapt:
                self._adapt()

    def _adapt(self) -> None:
        """Follow the backlog: bigger batches and lower JPEG quality while it grows, back when it drains."""
        capacity, compression = self.adapter.update(self.link.unacked)
        self.link.compression = compression
        if capacity != self.batch.capacity:
            space = self.robot.observation_space
            self.batch = BatchBuilder(space, self.robot.action_space, capacity)

    def _service_link(self, now: float) -> None:
        if self.batch.full or (self.batch.count and now - self._batch_started > self.settings.max_batch_delay_s):
            self._flush()
        if now - self._last_heartbeat > self.settings.heartbeat_s:
            self._update_rate(now)
            report = self.report()
            report.health, report.last_error = self.health.check()  # probes the robot: on this loop only
            self.link.heartbeat(report)
            self._last_heartbeat = now
        self.link.poll(0)

    def _update_rate(self, now: float) -> None:
        t0, n0 = self._rate_window
        if now - t0 > 0:
            self.steps_per_second = (self.steps - n0) / (now - t0)
        self._rate_window = (now, self.steps)

    def _wait_for_credit(self) -> None:
        """A paced sim holds between steps until the learner grants more steps (0: no limit). A person
        driving it is never made to wait: their keys would reach the robot late (the learner's credit
        catches up after they hand back)."""
        if not self.settings.pace_to_learner:
            return
        while not self._stop.is_set() and not self.link.stop_requested:
            self._check_refused()
            credit = self.link.step_credit
            if self.link.welcomed and (credit == 0 or self.steps < credit or self.interventions.person_driving):
                self.watchdog.due()
                return
            self.watchdog.pause()  # waiting for the learner on purpose: the robot is not stepping
            self.jitter.paused()
            self._flush()
            self._service_link(time.monotonic())
            self.link.poll(20)

    def _check_refused(self) -> None:
        """Stop stepping a robot whose data the learner refuses: nothing it does could be used."""
        if self.link.refused is not None:
            raise RobotRefused(f"the learner refused robot {self.robot.descriptor.id}: {self.link.refused}")

    def _robot_call(self, call, *args, unless_held: bool = False, **kwargs):
        """Call the robot, alone and noting since when: a robot that stops answering shows in `status()`.
        With `unless_held`, None instead if the watchdog held the robot since its last step."""
        with self._robot_lock:
            if unless_held and self._held:
                return None
            self._robot_since = time.monotonic()
            try:
                return call(*args, **kwargs)
            finally:
                self._robot_since = None
                self._answers += 1

    def _hold_unless_answered(self) -> bool:
        """The watchdog's hold: not needed (False) if the call it waited for returned meanwhile, since
        the loop then has a fresh observation and goes on; a stalled policy gets the robot held."""
        return self._hold_robot(unless_answered=True)

    def _hold_robot(self, unless_answered: bool = False) -> bool:
        """The robot's hold, never during another robot call: waits for one `hold_wait_s` at most."""
        answers = self._answers
        if not self._robot_lock.acquire(timeout=self.settings.safety.hold_wait_s):
            since = self._robot_since
            busy = f"for {time.monotonic() - since:.2f} s" if since else "still"
            raise HoldBlocked(f"a call to the robot (a step or reset) has not returned {busy}; not held")
        try:
            if unless_answered and self._answers != answers:
                return False
            self._held = True
            self.robot.hold()
            return True
        finally:
            self._robot_lock.release()

    def _start_episode(self, seed: int | None) -> dict[str, np.ndarray]:
        """Reset the robot: a new episode starts (any hold before it belongs to the last one)."""

        def reset() -> dict[str, np.ndarray]:
            self._held = False
            return self.robot.reset(seed=seed)

        self.chunks.restart()
        self.jitter.paused()
        self.watchdog.pause()  # a reset is not a stall
        obs = self._robot_call(reset)
        self.watchdog.due()
        return obs

    def _end_episode(self, reason: str) -> None:
        """Cut the episode in progress here: the learner stores it as truncated with `reason`."""
        if self._episode_step == 0:
            return  # none in progress (nothing sent since the last one ended)
        self._flush()
        self.link.send_episode_end(reason)
        log.warning(
            "%s: episode %d ended after %d steps (%s)",
            self.robot.descriptor.id,
            self.episodes,
            self._episode_step,
            reason,
        )
        self.episodes += 1
        self._episode_step = 0

    # -- the loop -----------------------------------------------------------------------------
    def run(self, max_steps: int | None = None) -> dict:
        s = self.settings
        prepare_control_loop_process()
        self.link.hello(self.acting_version)
        obs, seed = None, s.seed  # None: a new episode starts (reset) before the next step
        period = 1.0 / s.control_hz if s.control_hz > 0 else 0.0
        next_tick = time.monotonic()
        while not self._stop.is_set() and not self.link.stop_requested:
            if max_steps is not None and self.steps >= max_steps:
                break
            self._wait_for_credit()
            if self._stop.is_set() or self.link.stop_requested:
                break
            self._check_refused()
            if self.estop.tripped():
                self._stay_stopped()
                obs = None
                continue
            reset = self.requests.take_reset(self.episodes)
            if reset:
                self._end_episode(reset)
                obs = None
            if obs is None:
                obs, seed = self._start_episode(seed), None
                if (wait := self.observations.reset(obs, self.episodes)) is not None:  # unusable: reset again
                    obs = None
                    self._service_link(time.monotonic())
                    self._stop.wait(wait)
                    continue
            self._maybe_swap_weights()
            chosen, actor, proposal, chunk_step = self._choose_action(obs)
            idle, person = self.interventions.idle, self.interventions.person
            sent_at = time.time()
            result = self._robot_call(self.robot.step, self.safety(chosen, obs), unless_held=True)
            if result is None:  # the watchdog held the robot after `obs`: that episode is over
                self._end_episode("hold")
                obs = None
                continue
            self.watchdog.due()
            self.jitter.stepped()
            step, marked_by = self._outcome(result)
            reward, terminated, truncated, label, label_by = (
                step.reward,
                step.terminated,
                step.truncated,
                step.label,
                step.label_by,
            )
            bad = self.observations.step(result.observation, reward, self.episodes, self._episode_step)
            if bad is not None:  # its episode ends here; the good rows before it go on their own
                self._flush()
                truncated = True
            ended = terminated or truncated
            if self.batch.count == 0:
                self._batch_started = time.monotonic()
            self.batch.add(
                obs,
                result.action_applied,
                reward,
                terminated,
                truncated,
                episode=self.episodes,
                step=self._episode_step,
                policy_version=self.acting_version,
                actor=actor,
                label=label,
                sensor_time=time.time(),
                final_obs=result.observation if ended else None,
                label_by=label_by if label != pb.LABEL_NONE else pb.LABEL_BY_ENV,
                policy_action=proposal,
                chunk_step=chunk_step,
                idle=idle,
                person=person,
                label_person=marked_by if label != pb.LABEL_NONE and label_by == pb.LABEL_BY_PERSON else "",
            )
            self._tell_watchers(
                StepRecord(
                    result.observation,
                    result.action_applied,
                    proposal,
                    actor,
                    reward,
                    self.episodes,
                    self._episode_step,
                    self.acting_version,
                    ended,
                    label,
                    sent_at,
                    idle,
                    person,
                )
            )
            if bad is not None:  # this step alone in its batch (the learner quarantines it); the episode ends
                self._flush()
                self.link.send_episode_end(END_REASON)
            self.steps += 1
            self._episode_step += 1
            obs = result.observation
            if ended:
                self.episodes += 1
                self._episode_step = 0
                obs = None
            now = time.monotonic()
            self._service_link(now)
            if period:
                next_tick += period
                behind = time.monotonic() - next_tick
                if behind > 0:  # late: skip the ticks missed rather than step in a burst to catch up
                    next_tick += period * math.ceil(behind / period)
                time.sleep(max(0.0, next_tick - time.monotonic()))
        self.watchdog.pause()
        self._flush()
        self.link.poll(100)
        return self.status()

    def _outcome(self, result: StepResult) -> tuple[RewardedStep, str]:
        """What the row records of a step: a person's label (which ends the episode), else the env's
        success flag at an episode's end; then the run's reward decides the rest. The env's reward
        goes no further than here. With it, who marked the step ("": nobody did)."""
        terminated, truncated = result.terminated, result.truncated
        label, by = self.requests.take_mark(self.episodes, self._episode_step)
        label_by = pb.LABEL_BY_PERSON
        if label != pb.LABEL_NONE:
            terminated = terminated or label == pb.LABEL_SUCCESS
            truncated = not terminated
        elif (terminated or truncated) and "is_success" in result.info:
            label = pb.LABEL_SUCCESS if result.info["is_success"] else pb.LABEL_FAILURE
            label_by = pb.LABEL_BY_ENV
        return self.reward(result.observation, RewardedStep(result.reward, terminated, truncated, label, label_by)), by

    def _tell_watchers(self, record: StepRecord) -> None:
        """Watchers run on the loop's thread (they may render the robot): one that raises is dropped."""
        for watcher in list(self.step_watchers):
            try:
                watcher(record)
            except Exception:
                log.exception("%s: a step watcher failed; it is removed", self.robot.descriptor.id)
                self.step_watchers.remove(watcher)

    def drain(self, timeout_s: float) -> bool:
        """After `run`: keep the link serviced until every batch is acknowledged (True) or time is up."""
        deadline = time.monotonic() + timeout_s
        while self.link.unacked and time.monotonic() < deadline:
            self.link.poll(50)
        return self.link.unacked == 0

    def detach(self, timeout_s: float = 60.0) -> bool:
        """After `run`: deliver every spooled batch, then tell the learner this robot leaves (its open
        episode ends there). False if the learner could not be reached in time (the spool keeps the data)."""
        return self.drain(timeout_s) and self.link.leave()

    def report(self) -> pb.Heartbeat:
        """What this edge says of itself: the heartbeat the learner keeps per robot and reports in its
        status, and the heart of this edge's own `status`. (Health and the last error come from
        probing the robot, which only the control loop does: they are set where the heartbeat is sent.)"""
        return pb.Heartbeat(
            env_steps=self.steps,
            episodes=self.episodes,
            policy_version=self.acting_version,
            unacked_batches=self.link.unacked,
            steps_per_second=self.steps_per_second,
            backlog_bytes=self.link.spool.bytes_used,
            dropped_transitions=self.link.dropped_transitions,
            safety_violations=self._violations(),
            watchdog_holds=self.watchdog.holds,
            estopped=self.estop.tripped() or "",
            rearmed=self.estop.rearm_text(),
            intervention_steps=self.interventions.intervention_steps,
            take_overs=self.interventions.take_overs,
            driver=self.interventions.driver_name,
            **self._inference_stats(),
        )

    def status(self) -> dict:
        """The heartbeat's fields (`report`), then what only this edge's status shows."""
        return {
            **{name: value for name, value in message_fields(self.report()).items() if name not in SENT_ONLY},
            "robot_id": self.robot.descriptor.id,
            "epoch": self.link.epoch,
            "refused": self.link.refused,
            "link_error": self.link.handshake_error,
            "steps": self.steps,
            "newest_version": self.policy_version,  # received; takes over at the next chunk or episode
            "weight_checksum_failures": self.weights.checksum_failures,  # parts not as published: fetched again
            "batch_transitions": self.batch.capacity,
            "resends": self.link.resends,
            "lost_batches": self.link.lost_batches,  # unreadable spool files, sent as explicit gaps
            "bad_observations": self.observations.bad,  # NaN / inf observations: episode ended, robot reset
            "refused_batches": self.link.refused_batches,  # batches the learner refused (and quarantined)
            "reconnects": self.link.reconnects,  # connections replaced after ack_timeout_s of silence
            "hold_error": self.watchdog.last_failure,  # the last hold that failed (counted as hold_failed)
            "errors": self.errors(),
            "last_error": self.health.last_error or None,
            "estopped": self.estop.tripped(),
            "estop": self.estop.stop(),  # its reason, source ("cli", "page", ...) and who set it
            "rearmed": self.estop.last_rearm(),  # who re-armed this robot last, and what they cleared
            "refused_requests": self.requests.refused,  # marks / resets for an episode that had ended
            "estops": self.estops,
            "interventions": self.interventions.status(),
            "teleop": self.teleop.address if self.teleop is not None else None,
            "robot_unanswered_s": round(time.monotonic() - since, 2) if (since := self._robot_since) else 0.0,
        }

    def _inference_stats(self) -> dict[str, float]:
        """Inference latency, chunk age and control-loop jitter, as the heartbeat carries them."""
        stats = {"loop_jitter_p99_ms": self.jitter.p99_ms()}
        if isinstance(self.chunks, AsyncChunkRunner):
            runner = self.chunks.status()
            stats.update(
                inference_ms=runner["inference_ms"] or 0.0,
                inference_p99_ms=runner["inference_p99_ms"] or 0.0,
                chunk_age_steps=runner["chunk_age_steps"],
                starved_steps=runner["starved_steps"],
            )
        return stats

    def _violations(self) -> dict[str, int]:
        """The safety filter's interventions by kind, and holds that failed as "hold_failed"."""
        counts = dict(self.safety.violations)
        if self.watchdog.failures:
            counts["hold_failed"] = self.watchdog.failures
        return counts

    def errors(self) -> dict[str, str]:
        """Background parts that failed (e.g. the weight receiver), by part: empty while all is well."""
        return {"weights": self.weights.error} if self.weights.error else {}

    def stop(self) -> None:
        self._stop.set()

    def _stay_stopped(self) -> None:
        """Emergency stop: hold the robot, end its episode, take no step, keep the link alive, until
        re-armed (the loop then starts a new episode with a reset). A failed hold is retried every second."""
        self.watchdog.pause()
        held = self.watchdog.hold_now("estop", self._hold_robot)
        self.estops += 1
        stop = self.estop.stop() or {"reason": "emergency stop", "source": "?", "by": ""}
        log.warning(
            "%s: EMERGENCY STOP (%s; set by the %s%s): holding until re-armed",
            self.robot.descriptor.id,
            stop["reason"],
            stop["source"],
            f" ({stop['by']})" if stop["by"] else "",
        )
        self._end_episode("estop")
        retry_at = time.monotonic() + 1.0
        while self.estop.tripped() and not self._stop.is_set():
            if not held and time.monotonic() >= retry_at:
                held, retry_at = self.watchdog.hold_now("estop", self._hold_robot), retry_at + 1.0
            self._flush()
            self._service_link(time.monotonic())
            self.link.poll(20)
        if not self._stop.is_set():
            rearm = self.estop.last_rearm() or {}
            by = (
                rearm["by"]
                if rearm.get("time", 0.0) >= stop.get("time", 0.0)
                else "nobody named (the latch was removed)"
            )
            log.warning("%s: re-armed by %s", self.robot.descriptor.id, by)

    def _on_hold(self) -> None:
        log.warning(
            "%s: no action for %.2f s (policy stalled?): holding the robot",
            self.robot.descriptor.id,
            self.settings.safety.deadline_s,
        )

    def close(self) -> None:
        if self.teleop is not None:
            self.teleop.close()
        self.watchdog.close()
        if isinstance(self.chunks, AsyncChunkRunner):
            self.chunks.close()
        self.weights.close()
        self.link.close()
        self.interventions.close()  # a teleoperator device lets go before the robot does
        self.robot.close()
