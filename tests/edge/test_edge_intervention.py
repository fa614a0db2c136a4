"""Interventions on the edge: who acts instead of the policy, what is recorded, what the learner sees."""

from __future__ import annotations

import numpy as np
import pytest

from user_rl.cloud.buffer.rows import KIND_RECORD
from user_rl.edge.intervention import InterventionMux, StepView
from user_rl.edge.scripted import ScriptedIntervener
from user_rl.hal.registry import make_robot
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import intervened

REACH = {"type": "mujoco_reach", "options": {"obs_mode": "state"}}


class Person:
    """A source that drives while `holding` is set, always with the same action."""

    actor = pb.ACTOR_HUMAN

    def __init__(self, name: str, action: float) -> None:
        self.name, self.action, self.holding, self.asked = name, action, False, 0

    def act(self, view: StepView) -> np.ndarray | None:
        self.asked += 1
        return np.full(view.proposal.shape, self.action) if self.holding else None


def view(step: int) -> StepView:
    return StepView({}, np.zeros(3, np.float32), episode=0, step=step)


def test_one_source_drives_at_a_time_and_take_over_and_hand_back_are_events() -> None:
    first, second = Person("first", 0.5), Person("second", -0.5)
    mux = InterventionMux([first, second])
    action, actor = mux.choose(view(0))
    assert actor == pb.ACTOR_POLICY and (action == 0).all() and mux.driver_name == ""

    second.holding = True
    action, actor = mux.choose(view(1))
    assert actor == pb.ACTOR_HUMAN and (action == -0.5).all() and mux.driver_name == "second"
    # While "second" drives, "first" is not even asked, although it wants to drive now.
    first.holding, asked = True, first.asked
    for step in range(2, 5):
        assert (mux.choose(view(step))[0] == -0.5).all()
    assert first.asked == asked

    second.holding = False  # hands back: "first" may take over on the same step
    action, actor = mux.choose(view(5))
    assert (action == 0.5).all() and mux.driver_name == "first"
    first.holding = False
    assert mux.choose(view(6))[1] == pb.ACTOR_POLICY

    kinds = [(e.source, e.kind, e.step) for e in mux.events]
    assert kinds == [
        ("second", "take_over", 1),
        ("second", "hand_back", 5),
        ("first", "take_over", 5),
        ("first", "hand_back", 6),
    ]
    assert mux.take_overs == 2 and mux.intervention_steps == 5
    assert mux.rate == pytest.approx(5 / 7)


def test_the_scripted_intervener_takes_over_a_stuck_policy_and_hands_back_once_recovered() -> None:
    robot = make_robot("mujoco_reach", robot_id="r", seed=3)
    intervener = ScriptedIntervener(robot, patience=5, min_progress=0.01, handback_distance=0.05)
    mux = InterventionMux([intervener])
    try:
        obs = robot.reset(seed=3)
        start = robot.distance_to_goal()
        actors = []
        for step in range(50):
            action, actor = mux.choose(StepView(obs, np.zeros(3, np.float32), 0, step))  # the policy stays still
            actors.append(actor)
            result = robot.step(action)
            obs = result.observation
        # Still for 5 steps: no progress, so the expert takes over on step 5 ...
        assert actors[:5] == [pb.ACTOR_POLICY] * 5 and actors[5] == pb.ACTOR_SCRIPTED
        kinds = [(e.kind, e.step) for e in mux.events]
        assert kinds[0] == ("take_over", 5) and kinds[1][0] == "hand_back", kinds
        # ... and hands back within 5 cm, having moved the fingertip there from where it started.
        assert start > 0.1
        # The still policy then loses ground again only by drifting, so the expert keeps it close.
        assert robot.distance_to_goal() < 0.1

        # A policy that makes progress on its own is never interrupted.
        mux = InterventionMux([intervener])
        obs = robot.reset(seed=4)
        for step in range(30):
            action, actor = mux.choose(StepView(obs, robot.expert_action(), 0, step))
            assert actor == pb.ACTOR_POLICY
            obs = robot.step(action).observation
        assert mux.take_overs == 0
    finally:
        robot.close()


def test_the_scripted_expert_demonstrates_the_first_episodes_whole_then_watches() -> None:
    robot = make_robot("mujoco_reach", robot_id="r", seed=5)
    intervener = ScriptedIntervener(robot, patience=5, handback_distance=0.05, demo_episodes=2)
    try:
        for episode in range(3):
            mux = InterventionMux([intervener])
            obs = robot.reset(seed=4)  # a start from which the expert gains ground on every step
            for step in range(20):  # a policy that makes progress on its own (it proposes the expert's action)
                action, actor = mux.choose(StepView(obs, robot.expert_action(), episode, step))
                obs = robot.step(action).observation
                # Demonstrations: the expert drives every step, even where the policy was doing well.
                assert actor == (pb.ACTOR_SCRIPTED if episode < 2 else pb.ACTOR_POLICY), (episode, step)
            assert mux.take_overs == (1 if episode < 2 else 0)
    finally:
        robot.close()


def test_an_expert_watching_a_fraction_of_episodes_takes_over_in_those_alone() -> None:
    """`intervention.watched_fraction`: a stuck policy is taken over in that fraction of episodes,
    spread over them, and left alone in the rest."""
    robot = make_robot("mujoco_reach", robot_id="r", seed=3)
    intervener = ScriptedIntervener(robot, patience=5, handback_distance=0.05, watched_fraction=0.3)
    taken: list[int] = []
    try:
        for episode in range(40):
            mux = InterventionMux([intervener])
            obs = robot.reset(seed=3)
            for step in range(8):  # the policy stays still: stuck after 5 steps
                action, _ = mux.choose(StepView(obs, np.zeros(3, np.float32), episode, step))
                obs = robot.step(action).observation
            if mux.take_overs:
                taken.append(episode)
    finally:
        robot.close()
    assert 10 <= len(taken) <= 14, taken  # 30% of 40
    assert max(np.diff(taken)) <= 6 and taken[0] <= 3  # spread over the episodes: no gap of twice the mean


def test_a_robot_without_an_expert_is_refused_by_the_scripted_intervener() -> None:
    robot = make_robot("gym", robot_id="pole", env_id="InvertedPendulum-v5")
    try:
        with pytest.raises(ValueError, match=r"pole: the scripted intervener needs a sim with expert_action\(\)"):
            ScriptedIntervener(robot)
    finally:
        robot.close()


def test_scripted_interventions_reach_the_buffer_flagged_with_the_policys_proposals(running) -> None:
    learner, (edge,) = running(
        [
            "fleet.num_robots=1",
            "algo.learning_starts=300",
            "algo.batch_size=32",
            "policy.hidden=[32]",
            "learner.publish_every_updates=5",
            "fleet.batch_transitions=16",
            "intervention.scripted=true",
            "buffer.mix={online: 0.5, intervention: 0.5}",
        ],
        REACH,
    )
    wait_until(lambda: edge.policy_version >= 2 and edge.steps >= 800, 120, "policy versions and 800 steps")
    buffer = learner.buffer
    batch = buffer.sample(2000, np.random.default_rng(0))
    actors = batch["actor"]
    # Before the first policy: random warm-up (not an intervention); the expert takes over from it.
    assert {pb.ACTOR_WARMUP, pb.ACTOR_SCRIPTED, pb.ACTOR_POLICY} <= set(actors.tolist())
    # The mix samples interventions at their configured share (the source of a row is who acted).
    assert intervened(actors).mean() == pytest.approx(0.5, abs=0.05)
    scripted = actors == pb.ACTOR_SCRIPTED
    # Beside every scripted action, the policy's own proposal, which differs from it.
    assert np.abs(batch["policy_action"][scripted] - batch["action"][scripted]).max(axis=1).mean() > 0.05
    # Where the policy acted, its proposal is what was executed, unless the safety filter shrank it
    # (joint limits) or refused it (the workspace: the arm holds).
    policy = actors == pb.ACTOR_POLICY
    proposed, executed = batch["policy_action"][policy], batch["action"][policy]
    same = np.isclose(proposed, executed, atol=1e-6).all(axis=1)
    assert same.mean() > 0.9
    assert (np.abs(executed[~same]) <= np.abs(proposed[~same]) + 1e-6).all()
    assert not (~same).any() or sum(edge.safety.violations.values()) > 0

    wait_until(
        lambda: learner.status()["robots"][edge.robot.descriptor.id]["take_overs"] > 0, 10, "take-overs in a heartbeat"
    )
    assert 0 < learner.status()["robots"][edge.robot.descriptor.id]["intervention_rate"] < 1
    assert edge.status()["interventions"]["take_overs"] > 0


def test_a_persons_label_ends_the_episode_and_says_who_gave_it(running) -> None:
    learner, (edge,) = running(
        [
            "fleet.num_robots=1",
            "algo.learning_starts=100000",
            "fleet.batch_transitions=8",
            "fleet.pace_to_learner=false",
            "fleet.control_hz=20",
        ],
        {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 100}},
    )
    wait_until(lambda: edge.steps >= 20, 60, "steps")
    episode = edge.episodes
    edge.requests.mark(success=True)
    wait_until(lambda: edge.episodes > episode, 10, "the labelled episode to end")
    edge.requests.mark(success=False)
    wait_until(lambda: edge.episodes > episode + 1, 10, "the second labelled episode to end")
    flat = learner.buffer.cache.flat

    def labelled_rows() -> np.ndarray:  # on copies: the ingest thread writes on
        label, number, kind = flat["label"].copy(), flat["episode"].copy(), flat["kind"].copy()
        return np.flatnonzero(
            (label != pb.LABEL_NONE) & ((number == episode) | (number == episode + 1)) & (kind == KIND_RECORD)
        )

    wait_until(lambda: len(labelled_rows()) == 2, 30, "both labelled rows stored")
    success, failure = sorted(labelled_rows(), key=lambda row: flat["episode"][row])
    assert flat["label"][success] == pb.LABEL_SUCCESS and flat["label"][failure] == pb.LABEL_FAILURE
    # Who labelled is on the row; success ends the episode as terminated (the task is done: nothing
    # to bootstrap from), failure as truncated; both cut it short of the 100-step time limit.
    assert flat["label_by"][success] == flat["label_by"][failure] == pb.LABEL_BY_PERSON
    assert flat["terminated"][success] and not flat["truncated"][success]
    assert flat["truncated"][failure] and not flat["terminated"][failure]
    assert flat["step"][success] < 99 and flat["step"][failure] < 99
    # The learner's success rate counts people's labels like the env's (its status is refreshed twice a second).
    wait_until(
        lambda: learner.status()["robots"][edge.robot.descriptor.id]["recent_success"] == 0.5,
        10,
        "one success and one failure in the learner's status",
    )
