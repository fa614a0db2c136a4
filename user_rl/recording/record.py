"""`user-rl record`: people drive a robot, and each episode they drive goes into a buffer.

The loop, modelled on `lerobot-record`, at the robot's control rate::

    repeat until N episodes are kept:
        reset the robot; wait until someone drives (a LeRobot teleoperator always does)
        record: each step, the driver's action -> safety filter -> robot, for up to T s
                (an event or a key ends it early: success, failure, next, re-record, stop)
        reset time: R s driven but not recorded (none after the last episode)
        keep the episode, or discard it if a person asked to re-record it

It uses the edge's parts, not a copy of its loop: the intervention sources and their mux (a LeRobot
teleoperator, which drives on every step here, and the teleop page), the operator requests that
their events and the terminal's keys make (`keys.py`), the safety filter, the run's reward, the
e-stop latch (`user-rl estop ROBOT` stops a recording) and the edge's batch adder (`writer.py`).
There is no policy and no learner: every recorded step is the driver's (actor HUMAN for a person).

A step's row is written once the next step shows whether it was the episode's last, so an episode
that ends between two steps (a key, a label) ends on its last step with the observation after it,
as a time limit does. An episode's last row waits for the reset time to pass: LeRobot's re-record
pressed then discards the episode just recorded. An episode cut short for the robot's sake (a
driver's page that lost its connection: the robot holds) is kept as truncated, one the robot ends
itself as the robot says; an unusable (NaN) observation discards the episode and records it again.
Ctrl-C ends the recording: the episode in progress is discarded, finished ones are kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from user_rl.edge.intervention import InterventionMux, StepView
from user_rl.edge.jitter import LoopJitter
from user_rl.edge.obs_check import unusable
from user_rl.edge.operator import OperatorRequests, StepRecord
from user_rl.hal.robot import Observation, Robot, StepResult
from user_rl.recording.driving import (
    RobotStalled,
    RobotThread,
    Ticker,
    ended,
    filtered_step,
    say_on_stderr,
)
from user_rl.recording.writer import EpisodeWriter
from user_rl.rewards import RewardedStep, StepReward
from user_rl.robots.estop import EStopLatch
from user_rl.robots.safety import ActionFilter
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import DISCARD

log = logging.getLogger(__name__)
Say = Callable[[str], None]
PROGRESS_S = 1.0  # a progress line this often


@dataclass(frozen=True)
class RecordSettings:
    episodes: int  # to keep
    episode_time_s: float
    reset_time_s: float
    task: str
    control_hz: float  # the robot's control rate: the loop's, and the dataset's fps

    @property
    def episode_steps(self) -> int:
        return max(1, round(self.episode_time_s * self.control_hz))

    @property
    def reset_steps(self) -> int:
        return round(self.reset_time_s * self.control_hz)


@dataclass(frozen=True)
class Ending:
    """How an episode ended: kept or not, why (said on the terminal), its label, and whether recording stops."""

    kept: bool
    why: str
    label: int = pb.LABEL_NONE
    stop: bool = False
    by: str = ""  # who labelled it (the mark's `by`)


@dataclass
class Step:
    """A step taken but not written yet: written once it is known whether it was its episode's last."""

    episode: int
    step: int
    obs: Observation  # before the step
    action: np.ndarray  # as the robot applied it (after the safety filter)
    actor: int
    result: StepResult
    sensor_time: float
    person: str = ""  # who drove (the row's `actor_person`)


@dataclass
class RecordSummary:
    kept: int
    discarded: int  # episodes left out (re-recorded, interrupted, unusable)
    steps: int  # the kept episodes' steps
    control_hz: float
    buffer: str
    first_episode: int  # `user-rl replay --episode` of the first episode kept
    stopped: str = ""  # why recording stopped before every episode was kept ("" if it did not)
    failed: bool = False  # stopped by Ctrl-C, an e-stop or a robot that stopped answering
    late_steps: int = 0  # steps that came after their tick (the robot or the loop was slower than the rate)
    loop_jitter_p99_ms: float = 0.0
    lengths: list[int] = field(default_factory=list)


class Recorder:
    """One robot driven by people; its episodes written by an `EpisodeWriter`.

    It carries what the teleop page reads of a control loop (`robot`, `requests`, `interventions`,
    `estop`, `episodes`, `steps`, `step_watchers`, `settings.control_hz`, `policy_version`), so the
    edge's page serves a recording as it is."""

    policy_version = 0  # no policy acts

    def __init__(
        self,
        robot: Robot,
        calls: RobotThread,
        interventions: InterventionMux,
        requests: OperatorRequests,
        writer: EpisodeWriter,
        settings: RecordSettings,
        safety: ActionFilter,
        reward: StepReward,
        estop: EStopLatch,
        say: Say = say_on_stderr,
    ) -> None:
        self.robot, self.calls, self.interventions, self.requests = robot, calls, interventions, requests
        self.writer, self.settings, self.safety, self.reward = writer, settings, safety, reward
        self.estop, self.say = estop, say
        self.episodes = 0  # the buffer's number of the episode in progress (or just ended): discarded ones count
        self.steps = 0  # robot steps, reset time included
        self.step_watchers: list[Callable[[StepRecord], None]] = []
        self.teleop = None  # the teleop page's server, when there is one
        self.kept = self.discarded = 0
        self.lengths: list[int] = []
        self.ticker = Ticker(settings.control_hz)
        self.jitter = LoopJitter(1.0 / settings.control_hz)
        self.stopped = ""
        self._next_number = 0
        self._obs: Observation = {}
        self._pending: Step | None = None  # the newest step of the episode in progress
        self._held: tuple[Step, Ending] | None = None  # a kept episode's last step, until its reset time is over
        self._interrupted = threading.Event()
        self._quit = threading.Event()
        self._said_at = 0.0

    # -- asked from other threads --------------------------------------------------------------
    def interrupt(self) -> None:
        """Ctrl-C: stop now; the episode in progress is discarded, the finished ones are kept."""
        self._interrupted.set()

    @property
    def interrupted(self) -> bool:
        return self._interrupted.is_set()

    def quit(self) -> None:
        """The `q` key: the episode in progress ends here (kept) and recording stops."""
        self._quit.set()

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> RecordSummary:
        """Record until the episodes are kept or someone stops it; a robot that stops answering
        (`RobotStalled`) ends it too, with the finished episodes kept."""
        failed = False
        try:
            while self.kept < self.settings.episodes:
                ending = self._record_episode()
                if ending is not None:
                    self._finish(ending)
                if why := (ending.why if ending is not None and ending.stop else self._stop_asked()):
                    self.stopped = why
                    break
            failed = self.interrupted or bool(self.estop.tripped())
        except RobotStalled as exc:
            failed, self.stopped = True, str(exc)
            self._abandon()
        except BaseException:
            self._abandon()
            raise
        finally:
            self.writer.flush()
        return RecordSummary(
            kept=self.kept,
            discarded=self.discarded,
            steps=sum(self.lengths),
            control_hz=self.settings.control_hz,
            buffer=str(self.writer.directory),
            first_episode=self.writer.kept_before,
            stopped=self.stopped,
            failed=failed,
            late_steps=self.ticker.late,
            loop_jitter_p99_ms=self.jitter.p99_ms(),
            lengths=list(self.lengths),
        )

    def _record_episode(self) -> Ending | None:
        """Record one episode; how it ended (None: stopped before its first step)."""
        s = self.settings
        title = f"episode {self.kept + 1}/{s.episodes}"
        self._start_episode()
        step, waiting = 0, False
        while True:
            ending = self._asked_to_end(step)
            if ending is not None and (step > 0 or ending.stop):
                return self._end(ending) if step > 0 else None
            obs = self._obs
            proposal = self.calls.call(self.robot.hold_action, obs)
            action, actor = self.interventions.choose(StepView(obs, proposal, self.episodes, step))
            lost = getattr(self.interventions.driver, "holding", None) is not None  # a page that lost its link
            driven = actor != pb.ACTOR_POLICY and not lost
            if not driven and step > 0:
                why = "the driver's page lost its connection; the robot holds" if lost else "the driver handed back"
                return self._end(Ending(True, why))
            if not driven and not waiting:
                waiting = True
                self.say(f"{title}: waiting for someone to drive (take over on the teleop page)")
            if driven and step == 0:
                self.say(f"{title}: recording, up to {s.episode_time_s:g} s")
                self._said_at = time.monotonic()
            result = self._step(action, actor, obs, step if driven else 0)
            if not driven:  # nobody drives yet: the robot holds still, nothing is recorded
                self.ticker.wait()
                continue
            bad = unusable(result.observation, result.reward)
            if bad is not None:
                return self._end(Ending(False, f"{bad} at step {step}: discarded; recording it again"))
            if self._pending is not None:
                self._write(self._pending, None)
            person = self.interventions.person
            self._pending = Step(self.episodes, step, obs, result.action_applied, actor, result, time.time(), person)
            step += 1
            if ended(result, self.robot):
                return self._end(Ending(True, "the robot ended the episode"))
            if step >= s.episode_steps:
                return self._end(Ending(True, "time is up"))
            if self._progress_due():
                self.say(f"{title}: recording, {(s.episode_steps - step) / s.control_hz:.1f} s left")
            self.ticker.wait()

    def _finish(self, ending: Ending) -> None:
        """After an episode: its reset time (unless it was the last or recording stops), then keep or drop it."""
        s = self.settings
        title = f"episode {self.kept + 1}/{s.episodes}"
        last = ending.stop or (ending.kept and self.kept + 1 == s.episodes)
        held = self._held is not None
        if not held:  # discarded already (re-record, unusable observation, interrupted)
            self.say(f"{title}: {ending.why}")
        rerecord = not last and self._reset_time(title, held) and held
        if not held:
            return
        replay_as = self.writer.kept_before + self.kept
        length = self._write_held(discard=rerecord)
        if rerecord:
            self.say(f"{title}: discarded (re-record); recording it again")
            return
        label = f", {pb.Label.Name(ending.label).removeprefix('LABEL_').lower()}" if ending.label else ""
        self.say(f"{title}: kept, {length} steps ({ending.why}{label}); replay it with --episode {replay_as}")

    def _reset_time(self, title: str, undoable: bool) -> bool:
        """LeRobot's reset phase: the robot is driven for `reset_time_s` and nothing is recorded. True if a
        person asked to re-record the episode just recorded (`undoable`: there is one); a label or Enter
        ends it early."""
        steps = self.settings.reset_steps
        if steps <= 0:
            return False
        keys = "Enter: next episode now" + (", r: re-record the last one" if undoable else "")
        self.say(f"{title}: resetting for {self.settings.reset_time_s:g} s (not recorded; {keys})")
        self._said_at = time.monotonic()
        self.ticker.restart()
        self.jitter.paused()
        for i in range(steps):
            if self._stop_asked():
                return False
            reset, label = self.requests.take_reset(), self.requests.take_label()
            if reset == DISCARD:
                return True
            if reset or label != pb.LABEL_NONE:
                return False
            obs = self._obs
            proposal = self.calls.call(self.robot.hold_action, obs)
            action, actor = self.interventions.choose(StepView(obs, proposal, self.episodes, i))
            result = self._step(action, actor, obs, i)
            if ended(result, self.robot):  # a sim that ended cannot be stepped on
                self._obs = self.calls.call(self.robot.reset)
            if self._progress_due():
                self.say(f"{title}: resetting, {(steps - i - 1) / self.settings.control_hz:.1f} s left")
            self.ticker.wait()
        return False

    # -- one step ------------------------------------------------------------------------------
    def _start_episode(self) -> None:
        """A new episode: the robot's reset (a sim's new episode, a LeRobot arm's reset pose or just a read)."""
        self.episodes, self._next_number = self._next_number, self._next_number + 1
        obs = self.calls.call(self.robot.reset)
        bad = unusable(obs)
        if bad is not None:
            raise RuntimeError(f"{self.robot.descriptor.id}: the reset's observation is unusable: {bad}")
        self._obs = obs
        for take in (self.requests.take_label, self.requests.take_reset):  # from before this episode: void
            take()
        self.ticker.restart()
        self.jitter.paused()

    def _step(self, action: np.ndarray, actor: int, obs: Observation, step: int) -> StepResult:
        """Filter and send one action on the robot's thread; tell the watchers (the teleop page)."""
        sent_at = time.time()
        result = self.calls.call(filtered_step, self.robot, self.safety, action, obs)
        self.steps += 1
        self.jitter.stepped()
        self._obs = result.observation
        record = StepRecord(
            result.observation,
            result.action_applied,
            result.action_applied,
            actor,
            result.reward,
            self.episodes,
            step,
            self.policy_version,
            result.terminated or result.truncated,
            pb.LABEL_NONE,
            sent_at,
        )
        for watcher in list(self.step_watchers):
            try:
                self.calls.call(watcher, record)  # it may render the robot: on the robot's thread
            except RobotStalled:
                raise
            except Exception:
                log.exception("a step watcher failed; it is removed")
                self.step_watchers.remove(watcher)
        return result

    def _asked_to_end(self, step: int) -> Ending | None:
        """What people asked since the last step, as how the episode ends (None: it goes on)."""
        if why := self._stop_asked():
            return Ending(self._quit.is_set() and not self.interrupted and not self.estop.tripped(), why, stop=True)
        reset = self.requests.take_reset(self.episodes)
        label, by = self.requests.take_mark(self.episodes, step - 1)
        if reset == DISCARD:
            return Ending(False, "discarded (re-record); recording it again")
        if label != pb.LABEL_NONE:
            return Ending(True, "ended by a person", label=label, by=by)
        if reset:
            return Ending(True, "ended early")
        return None

    def _stop_asked(self) -> str:
        if self.interrupted:
            return "interrupted (Ctrl-C)"
        if stop := self.estop.tripped():
            return f"emergency stop ({stop}); `user-rl rearm {self.robot.descriptor.id}` clears it"
        if self._quit.is_set():
            return "q pressed"
        return ""

    def _progress_due(self) -> bool:
        """Whether a progress line is due (one every `PROGRESS_S`)."""
        now = time.monotonic()
        if now - self._said_at < PROGRESS_S:
            return False
        self._said_at = now
        return True

    # -- writing -------------------------------------------------------------------------------
    def _end(self, ending: Ending) -> Ending:
        """The episode in progress is over: its last step waits for the reset time if kept; else it is discarded."""
        if ending.kept and self._pending is not None:
            self._held = (self._pending, ending)
        elif self._pending is not None:
            self._write(self._pending, None)
            self.writer.discard_open()
            self.discarded += 1
        self._pending = None
        return ending

    def _write_held(self, discard: bool) -> int:
        """Write the kept episode's last step, or discard the episode (re-record); its length."""
        step, ending = self._held
        self._held = None
        if discard:
            self._write(step, None)
            self.writer.discard_open()
            self.discarded += 1
        else:
            self._write(step, ending)
            self.writer.flush()
            self.kept += 1
            self.lengths.append(step.step + 1)
        return step.step + 1

    def _write(self, step: Step, ending: Ending | None) -> None:
        """One row; `ending`: it is the episode's last, ended so (None: more follow, or it is discarded)."""
        r = step.result
        terminated = truncated = False
        label, label_by, by = pb.LABEL_NONE, pb.LABEL_BY_ENV, ""
        if ending is not None:
            terminated, truncated, label = r.terminated, r.truncated, ending.label
            if label != pb.LABEL_NONE:
                terminated, label_by, by = terminated or label == pb.LABEL_SUCCESS, pb.LABEL_BY_PERSON, ending.by
            elif "is_success" in r.info:
                label = pb.LABEL_SUCCESS if r.info["is_success"] else pb.LABEL_FAILURE
            truncated = not terminated  # a kept episode ends on its last row, with the observation after it
        row = self.reward(r.observation, RewardedStep(r.reward, terminated, truncated, label, label_by))
        self.writer.add(
            obs=step.obs,
            action=step.action,
            reward=row.reward,
            terminated=row.terminated,
            truncated=row.truncated,
            episode=step.episode,
            step=step.step,
            policy_version=self.policy_version,
            actor=step.actor,
            label=row.label,
            sensor_time=step.sensor_time,
            final_obs=r.observation if row.ended else None,
            label_by=row.label_by if row.label != pb.LABEL_NONE else pb.LABEL_BY_ENV,
            policy_action=step.action,
            person=step.person,
            label_person=by if row.label != pb.LABEL_NONE and row.label_by == pb.LABEL_BY_PERSON else "",
        )

    def _abandon(self) -> None:
        """After an error: the episode in progress is discarded, one waiting for its reset time kept."""
        try:
            if self._pending is not None:
                self._end(Ending(False, "abandoned"))
            if self._held is not None:
                self._write_held(discard=False)
        except Exception:  # the buffer itself may be what failed
            log.exception("could not write the last steps")


# -- `user-rl record CONFIG` --------------------------------------------------------------------
