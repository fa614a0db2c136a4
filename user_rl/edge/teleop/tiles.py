"""What a console tile shows of a robot beyond its page's state: how it has been doing lately, how its
link to the learner is, and how far its policy lags behind the learner's newest.

Everything here is what the edge itself can truthfully know; each field says what it counts:

- `success_rate`: of the last `EPISODES` episodes that ended on a step of their own (a success or
  failure label, by a person, the sim's success flag or a classifier; or the robot's step limit),
  the share labelled success, over those that carry a label (`success_of`); None before any did.
  Episodes cut by an e-stop, a reset or a watchdog hold end between steps and are not counted.
- `intervention_rate`: of the last `STEPS` steps this robot took, the share a person or the
  scripted expert acted (`human` / `scripted` rows, the learner's `intervention` source);
  warm-up and policy steps are not interventions. The learner's status has its own over the
  steps it stored (`robots.<id>.intervention_rate`); this one needs no learner and is current.
- `link`: the edge's data link as the edge sees it: `ok` (connected and welcomed by the learner),
  `connecting` (connected, no answer to its hello yet), `disconnected` (no TCP connection),
  `handshake failing` or `refused: WHY`; with `backlog`, the batches spooled and not yet
  acknowledged as durable (the data the learner does not have yet), and `reconnects`.
- `policy`: `acting` (the version whose actions the robot takes; -1 during warm-up), `published`
  (the newest version the learner had published when it last acknowledged this edge's data; -1
  before any) and `lag` = published - acting, the versions behind (None during warm-up). The
  edge hears of a new version with the next ack, so `published` is at most one ack old.

The tracker is fed each step on the control loop's thread and read on the page server's: a lock
keeps its windows whole.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING

from user_rl.edge.operator import StepRecord
from user_rl.wire import user_rl_pb2 as pb

if TYPE_CHECKING:
    from user_rl.edge.daemon import EdgeDaemon

EPISODES = 20  # episodes in the success rate's window
STEPS = 200  # steps in the intervention rate's window
INTERVENED = (pb.ACTOR_HUMAN, pb.ACTOR_SCRIPTED)
LABELLED = (pb.LABEL_SUCCESS, pb.LABEL_FAILURE)


class TileTracker:
    def __init__(self, edge: EdgeDaemon, episodes: int = EPISODES, steps: int = STEPS) -> None:
        self.edge = edge
        self._lock = threading.Lock()
        self._episodes: deque[int] = deque(maxlen=episodes)  # pb.Label of each ended episode's last row
        self._steps: deque[bool] = deque(maxlen=steps)  # whether each step was an intervention
        self._intervened = 0  # of the steps in the window

    def on_step(self, record: StepRecord) -> None:
        """One step of the robot (the control loop's thread)."""
        intervened = record.actor in INTERVENED
        with self._lock:
            if len(self._steps) == self._steps.maxlen:
                self._intervened -= self._steps[0]
            self._steps.append(intervened)
            self._intervened += intervened
            if record.ended:
                self._episodes.append(record.label)

    def rates(self) -> dict:
        with self._lock:
            labels, steps, intervened = list(self._episodes), len(self._steps), self._intervened
        labelled = [label for label in labels if label in LABELLED]
        return {
            "success_rate": round(labelled.count(pb.LABEL_SUCCESS) / len(labelled), 3) if labelled else None,
            "success_of": len(labelled),
            "episodes_ended": len(labels),
            "intervention_rate": round(intervened / steps, 3) if steps else None,
            "intervention_of": steps,
        }

    def link(self) -> dict | None:
        """None for a robot with no learner to stream to (`user-rl record`'s recorder)."""
        link = getattr(self.edge, "link", None)
        if link is None:
            return None
        if link.refused:
            state = f"refused: {link.refused}"
        elif link.handshake_error:
            state = "handshake failing"
        elif not link.connected:
            state = "disconnected"
        elif not link.welcomed:
            state = "connecting"
        else:
            state = "ok"
        return {"state": state, "backlog": link.unacked, "reconnects": link.reconnects}

    def policy(self) -> dict | None:
        """None for a robot with no learner (no versions to lag behind)."""
        if getattr(self.edge, "link", None) is None:
            return None
        acting, published = self.edge.acting_version, self.edge.link.learner_version
        lag = None if acting < 0 else max(0, published - acting)
        return {"acting": acting, "published": published, "lag": lag}

    def state(self) -> dict:
        """The tile's fields, merged into the page's state message."""
        return {**self.rates(), "link": self.link(), "policy": self.policy()}
