"""Who acts instead of the policy: intervention sources, and the mux the control loop asks each step.

The policy proposes an action on every step, whoever drives, so its proposal is stored beside
the action actually taken (`policy_action`). Then the mux asks its sources, in the order given:
the first that returns an action drives, and keeps driving until it returns None. One source
drives at a time: while one drives, the others are not asked. Taking over and handing back are
explicit events, kept (the last `EVENTS_KEPT`), logged and counted for the heartbeat.

A source is anything with a `name`, the `actor` its steps are recorded as (`ACTOR_HUMAN` for a
person at the teleop page, `ACTOR_SCRIPTED` for the scripted intervener that stands in for one in
simulation), and `act(view) -> action | None`. A source that can tell when its person holds nothing
(the teleop page: no key, stick or button) also has `idle`, True after an `act` whose action only
held the robot still for that reason: the mux passes it on (`idle`) and the row is flagged, so the
buffer does not take it for a demonstration (`wire/transitions.IDLE`). A person's source may name
who acts with `person` (the teleop page: its driver's name, set by each `act`); else its `name`
stands for them. The mux passes it on (`person`) and the row records it (`wire/transitions.PEOPLE`);
the scripted intervener is nobody.

An action a source returns is in the robot's own terms (`Robot.action_mode`): for an arm of
absolute position goals it is a goal, so a source with nothing to do must return the robot's
hold-still action for `view.obs` (`Robot.hold_action`), never zero. A person's keys and gamepad go
through `edge/motion.py`, which does that; a LeRobot teleoperator sends goals in the robot's
action names; the scripted expert acts in its sim's terms. Whatever a source sends, the safety
filter then limits it (for an absolute robot, to a per-step distance from the current pose).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from user_rl.wire import user_rl_pb2 as pb

log = logging.getLogger(__name__)

EVENTS_KEPT = 100
RATE_WINDOW_STEPS = 500  # the intervention rate is over this many recent steps


@dataclass(frozen=True)
class StepView:
    """What a source sees before a step: the observation, the policy's proposal, where we are."""

    obs: dict[str, np.ndarray]
    proposal: np.ndarray
    episode: int
    step: int  # within the episode


@dataclass(frozen=True)
class InterventionEvent:
    time: float  # wall clock (s)
    episode: int
    step: int
    source: str
    kind: str  # "take_over" | "hand_back"


class InterventionSource(Protocol):
    name: str
    actor: int

    def act(self, view: StepView) -> np.ndarray | None:
        """The action to take instead of the policy's this step, or None: the policy acts."""


class InterventionMux:
    """Asks the sources each step; says who acted, keeps events, counts and the recent rate."""

    def __init__(self, sources: list[InterventionSource] | None = None) -> None:
        self.sources: list[InterventionSource] = list(sources or [])
        self.driver: InterventionSource | None = None
        self.events: deque[InterventionEvent] = deque(maxlen=EVENTS_KEPT)
        self.take_overs = 0
        self.intervention_steps = 0
        self.idle = False  # the step chosen last: a source drove and its person held nothing
        self.idle_steps = 0  # such steps so far
        self.person = ""  # the step chosen last: the name of the person whose source drove ("": nobody)
        self._recent: deque[bool] = deque(maxlen=RATE_WINDOW_STEPS)
        self._lock = threading.Lock()  # sources may be added from another thread (the teleop server)

    def add(self, source: InterventionSource) -> None:
        with self._lock:
            self.sources.append(source)

    @property
    def driver_name(self) -> str:
        """Who acts now: "" for the policy, else the source's name."""
        driver = self.driver
        return driver.name if driver is not None else ""

    @property
    def person_driving(self) -> bool:
        """A person acts, or has just taken over (a page's take-over counts before its first step):
        a sim paced to the learner must not make them wait."""
        driver = self.driver
        if driver is not None and driver.actor == pb.ACTOR_HUMAN:
            return True
        with self._lock:
            sources = list(self.sources)
        return any(s.actor == pb.ACTOR_HUMAN and getattr(s, "engaged", False) for s in sources)

    @property
    def rate(self) -> float:
        """The fraction of the last `RATE_WINDOW_STEPS` steps on which someone intervened."""
        return sum(self._recent) / len(self._recent) if self._recent else 0.0

    def choose(self, view: StepView) -> tuple[np.ndarray, int]:
        """The action to take and who chose it (`pb.Actor`): a source's, or the policy's proposal."""
        with self._lock:
            sources = list(self.sources)
        self.idle, self.person = False, ""
        if self.driver is not None:  # the driver alone is asked while it drives
            action = self.driver.act(view)
            if action is not None:
                return self._intervene(self.driver, action, view)
            self._event(self.driver, view, "hand_back")
            handed_back, self.driver = self.driver, None
            sources = [s for s in sources if s is not handed_back]  # another one may take over at once
        for source in sources:
            action = source.act(view)
            if action is not None:
                self._event(source, view, "take_over")
                self.take_overs += 1
                self.driver = source
                return self._intervene(source, action, view)
        self._recent.append(False)
        return view.proposal, pb.ACTOR_POLICY

    def _intervene(self, source: InterventionSource, action: np.ndarray, view: StepView) -> tuple[np.ndarray, int]:
        self.intervention_steps += 1
        self._recent.append(True)
        self.idle = bool(getattr(source, "idle", False))
        self.idle_steps += self.idle
        if source.actor == pb.ACTOR_HUMAN:
            self.person = str(getattr(source, "person", "") or source.name)
        return np.asarray(action, dtype=view.proposal.dtype).reshape(view.proposal.shape), source.actor

    def _event(self, source: InterventionSource, view: StepView, kind: str) -> None:
        self.events.append(InterventionEvent(time.time(), view.episode, view.step, source.name, kind))
        log.info("%s %s at episode %d step %d", source.name, kind.replace("_", " "), view.episode, view.step)

    def close(self) -> None:
        """Let go of the sources that hold a device (a LeRobot teleoperator)."""
        for source in self.sources:
            close = getattr(source, "close", None)
            if callable(close):
                close()

    def status(self) -> dict:
        return {
            "driver": self.driver_name,
            "take_overs": self.take_overs,
            "intervention_steps": self.intervention_steps,
            "idle_steps": self.idle_steps,
            "rate": round(self.rate, 4),
            "events": [e.__dict__ for e in list(self.events)[-10:]],
        }
