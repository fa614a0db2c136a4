"""The scripted intervener: an expert controller that stands in for a person in simulation (CI).

Its take-over rule, the one a watchful operator follows: it watches the policy, and once the robot's
distance to its goal has shrunk by less than `min_progress` over the last `patience` steps (stuck,
or moving away) while still farther than `handback_distance`, it takes over and drives with the
sim's expert until the distance is below `handback_distance`; then it hands back and starts watching
again. A new episode starts with the policy in charge. As the policy improves it keeps making
progress, so the intervention rate falls. `demo_episodes`: the expert drives the robot's first
episodes from start to end, as a person records a few demonstrations before the policy's first try
(HIL-SERL does the same): whole clean episodes to imitate, where take-overs alone give fragments
that start from the policy's mistakes. `watched_fraction`: the expert watches only this fraction of
episodes (spread evenly over them), as one operator does who looks after several robots; the others
are the policy's alone.

The robot must offer `expert_action()` and `distance_to_goal()` (a sim knows its target; the
reach arm has both).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from user_rl.edge.intervention import StepView
from user_rl.hal.robot import Robot
from user_rl.wire import user_rl_pb2 as pb

GOLDEN = 0.6180339887498949


class ScriptedIntervener:
    name = "scripted"
    actor = pb.ACTOR_SCRIPTED

    def __init__(
        self,
        robot: Robot,
        patience: int = 5,
        min_progress: float = 0.01,
        handback_distance: float = 0.05,
        demo_episodes: int = 0,
        watched_fraction: float = 1.0,
    ) -> None:
        missing = [m for m in ("expert_action", "distance_to_goal") if not callable(getattr(robot, m, None))]
        if missing:
            raise ValueError(
                f"{robot.descriptor.id}: the scripted intervener needs a sim with "
                f"{' and '.join(m + '()' for m in missing)} (mujoco_reach has them)"
            )
        self.robot = robot
        self.patience = patience
        self.min_progress = min_progress
        self.handback_distance = handback_distance
        self.demo_episodes = demo_episodes
        self.watched_fraction = watched_fraction
        self.driving = False
        self.watching = True
        self._distances: deque[float] = deque(maxlen=patience + 1)

    def act(self, view: StepView) -> np.ndarray | None:
        if view.episode < self.demo_episodes:  # a demonstration: the expert drives throughout
            self.driving = True
            return self.robot.expert_action()
        if view.step == 0:  # a new episode: the policy gets its chance
            self._distances.clear()
            self.driving = False
            self.watching = watched(view.episode, self.watched_fraction)
        if not self.watching:
            return None
        distance = float(self.robot.distance_to_goal())
        if self.driving and distance < self.handback_distance:
            self.driving = False
            self._distances.clear()
        self._distances.append(distance)
        stuck = (
            len(self._distances) > self.patience
            and self._distances[0] - distance < self.min_progress
            and distance >= self.handback_distance
        )  # hovering at the goal is not being stuck
        if self.driving or stuck:
            self.driving = True
            return self.robot.expert_action()
        return None


def watched(episode: int, fraction: float) -> bool:
    """Whether the expert watches episode `episode`: `fraction` of episodes, spread evenly (the golden
    ratio's sequence), the same ones on every run."""
    return fraction >= 1.0 or (episode * GOLDEN) % 1.0 < fraction
