"""The MuJoCo reach arm: spaces, randomisation, workspace, truncation, solvability, images."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from user_rl.hal.descriptor import describe
from user_rl.sim.reach import (
    ACTION_SCALE,
    SUCCESS_DISTANCE,
    TARGET_HEIGHT,
    TARGET_RADIUS,
    TARGET_YAW,
    ReachRobot,
    reach_reward,
)


@pytest.fixture
def robot():
    r = ReachRobot(seed=0)
    yield r
    r.close()


def jacobian_action(r: ReachRobot) -> np.ndarray:
    """Damped least-squares step towards the target, scaled into the [-1, 1] action box."""
    jac = np.zeros((3, r.model.nv))
    mujoco.mj_jacSite(r.model, r.data, jac, None, r.model.site("ee").id)
    err = r.target_pos - r.ee_pos
    dq = jac.T @ np.linalg.solve(jac @ jac.T + 1e-4 * np.eye(3), err)
    a = dq / ACTION_SCALE
    return (a / max(1.0, np.abs(a).max())).astype(np.float32)


def success_rate(r: ReachRobot, policy, episodes: int) -> float:
    wins = 0
    for _ in range(episodes):
        r.reset()
        for _ in range(r.episode_steps):
            res = r.step(policy(r))
        assert res.truncated
        wins += res.info["is_success"]
    return wins / episodes


def test_spaces_joints_and_descriptor(robot):
    m = robot.model
    assert m.nu >= 3 and m.njnt >= 3
    assert list(m.jnt_axis[0]) == [0, 0, 1]  # base yaw about z
    assert robot.action_space.shape == (3,) and robot.action_space.dtype == np.float32
    assert np.all(robot.action_space.low == -1) and np.all(robot.action_space.high == 1)
    assert set(robot.observation_space.spaces) == {"state"}
    obs = robot.reset()
    assert obs["state"].dtype == np.float32 and obs["state"] in robot.observation_space["state"]
    assert obs["state"].shape == robot.observation_space["state"].shape
    d = robot.descriptor
    assert (d.kind, d.model, d.id, d.control_hz, d.cameras) == ("sim", "reach_arm_3dof", "reach-0", 25.0, ())
    assert "red target" in d.instruction
    assert d.joint_limits[2] == pytest.approx((-2.7, 2.7)) and len(d.joint_limits) == 3
    (x_lo, x_hi), _, (z_lo, z_hi) = d.workspace
    assert x_lo < -0.5 and x_hi > 0.5 and z_lo <= 0.0 < 0.6 < z_hi  # the whole 0.5 m reach
    described = describe(robot, "lab-1")
    assert (described["node"], described["action_space"], described["health"]["ok"]) == (
        "lab-1",
        "float32 (3,) in [-1, 1]",
        True,
    )
    assert described["observation_space"] == {"state": "float32 (18,)"}
    # one control step lasts 1 / control_hz of simulated time
    assert robot.n_substeps * m.opt.timestep == pytest.approx(1 / 25.0)


def test_target_does_not_collide(robot):
    geom = robot.model.geom("target")
    assert geom.contype == 0 and geom.conaffinity == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"episode_steps": 0},
        {"episode_steps": 1001},
        {"obs_mode": "depth"},
        {"control_hz": 0},
        {"arm": "9dof"},
        {"targets": "shelf"},
        {"camera": "side"},
        {"success_distance": 0},
        {"obs_mode": "image", "camera": "top", "extra_cameras": ("top",)},
        {"goal": "red"},
        {"targets": "two_colours", "goal": "blue"},
    ],
)
def test_bad_options_rejected(bad):
    with pytest.raises(ValueError):
        ReachRobot(**bad)


def test_episodes_differ_and_reproduce():
    a, b = ReachRobot(seed=7), ReachRobot(seed=7)
    first = [(a.reset()["state"], a.data.qpos.copy(), a.target_pos) for _ in range(3)]
    again = [(b.reset()["state"], b.data.qpos.copy(), b.target_pos) for _ in range(3)]
    for (s1, q1, _), (s2, q2, _) in zip(first, again):
        np.testing.assert_array_equal(s1, s2)
        np.testing.assert_array_equal(q1, q2)
    assert not np.allclose(first[0][1], first[1][1]) and not np.allclose(first[0][2], first[1][2])
    np.testing.assert_array_equal(a.reset(seed=3)["state"], b.reset(seed=3)["state"])
    assert not np.array_equal(a.reset(seed=3)["state"], a.reset(seed=4)["state"])


def ik(r: ReachRobot, target: np.ndarray) -> np.ndarray | None:
    """Analytic elbow-up inverse kinematics from the model's own link lengths."""
    m = r.model
    h, l1, l2 = m.body("upper_arm").pos[2], m.body("forearm").pos[2], m.site("ee").pos[2]
    rad, dz = np.hypot(target[0], target[1]), target[2] - h
    cos_e = (rad**2 + dz**2 - l1**2 - l2**2) / (2 * l1 * l2)
    if abs(cos_e) > 1:
        return None
    elbow = np.arccos(cos_e)
    shoulder = np.arctan2(rad, dz) - np.arctan2(l2 * np.sin(elbow), l1 + l2 * np.cos(elbow))
    return np.array([np.arctan2(target[1], target[0]), shoulder, elbow])


def test_targets_span_workspace_and_are_reachable(robot):
    targets = []
    for _ in range(300):
        robot.reset()
        t = robot.target_pos
        targets.append(t)
        yaw, rad = np.arctan2(t[1], t[0]), np.hypot(t[0], t[1])
        assert TARGET_YAW[0] <= yaw <= TARGET_YAW[1]
        assert TARGET_RADIUS[0] <= rad <= TARGET_RADIUS[1]
        assert TARGET_HEIGHT[0] <= t[2] <= TARGET_HEIGHT[1]
        q = ik(robot, t)
        assert q is not None, f"target {t} out of reach"
        lo, hi = robot.model.jnt_range.T
        assert np.all(q >= lo) and np.all(q <= hi), f"target {t} needs joints {q} outside limits"
        robot.data.qpos[:] = q
        mujoco.mj_kinematics(robot.model, robot.data)
        np.testing.assert_allclose(robot.ee_pos, t, atol=1e-6)
        assert robot.data.xpos[robot.model.body("forearm").id][2] > 0.05  # elbow clear of floor
    span = np.ptp(np.array(targets), axis=0)
    assert max(span[0], span[1]) >= 0.30


def test_truncation_exactly_at_episode_steps():
    r = ReachRobot(seed=1, episode_steps=7)
    r.reset()
    flags = [r.step(np.zeros(3, np.float32)) for _ in range(7)]
    assert [f.truncated for f in flags] == [False] * 6 + [True]
    assert not any(f.terminated for f in flags)
    with pytest.raises(RuntimeError):
        r.step(np.zeros(3, np.float32))
    r.reset()
    assert not r.step(np.zeros(3, np.float32)).truncated


def test_action_is_clipped_and_tracked(robot):
    robot.reset(seed=2)
    q0 = robot.data.qpos.copy()
    res = robot.step(np.array([5.0, -5.0, 0.5]))
    assert res.action_applied.dtype == np.float32
    np.testing.assert_array_equal(res.action_applied, [1.0, -1.0, 0.5])
    # the stiff servos reach the commanded joint targets within one control step
    np.testing.assert_allclose(robot.data.qpos, q0 + ACTION_SCALE * res.action_applied, atol=0.01)
    assert res.reward == pytest.approx(reach_reward(res.info["distance"]))
    assert res.info["distance"] == pytest.approx(np.linalg.norm(robot.target_pos - robot.ee_pos))


def test_reward_bonus_on_success():
    assert reach_reward(SUCCESS_DISTANCE / 2) > 0 > reach_reward(SUCCESS_DISTANCE * 2)
    assert reach_reward(0.1) > reach_reward(0.2)


def test_scripted_controller_solves_task_and_baselines_do_not():
    r = ReachRobot(seed=11)
    assert success_rate(r, jacobian_action, 40) >= 0.95
    assert success_rate(r, lambda _: np.zeros(3, np.float32), 40) < 0.2
    assert success_rate(r, lambda x: x.action_space.sample(), 40) < 0.2
    r.close()


def test_the_4dof_arm_is_a_second_model_with_its_own_spaces_and_is_solvable():
    r = ReachRobot(arm="4dof", seed=5)
    assert r.action_space.shape == (4,) and r.observation_space["state"].shape == (3 * 4 + 9,)
    assert r.descriptor.model == "reach_arm_4dof"
    for _ in range(100):  # start poses keep the elbow, wrist and fingertip off the floor
        r.reset()
        heights = [r.data.xpos[r.model.body(name).id][2] for name in ("forearm", "hand")] + [r.ee_pos[2]]
        assert min(heights) >= 0.06 and r.distance >= 0.10
    assert success_rate(r, jacobian_action, 40) >= 0.95
    assert success_rate(r, lambda _: np.zeros(4, np.float32), 40) < 0.2
    r.close()


def test_success_flag_matches_distance():
    r = ReachRobot(seed=5)
    r.reset()
    for _ in range(r.episode_steps):
        res = r.step(jacobian_action(r))
        assert res.info["is_success"] == (res.info["distance"] < SUCCESS_DISTANCE)
    assert res.info["is_success"] and res.reward > 0


def test_image_mode():
    r = ReachRobot(obs_mode="image", image_size=64, seed=0)
    assert r.descriptor.cameras == ("front",)
    obs = r.reset()
    assert set(obs) == {"state", "image"} and obs in r.observation_space
    # the arm only (sin, cos, velocity per joint, the fingertip): where the target is, only the pixels say
    assert obs["state"].shape == (3 * r.model.nq + 3,)
    np.testing.assert_allclose(obs["state"][-3:], r.ee_pos, atol=1e-6)
    assert r.set_target(r.target_pos + 0.05)["state"].tolist() == obs["state"].tolist()
    img = obs["image"]
    assert img.dtype == np.uint8 and img.shape == (64, 64, 3) and img.std() > 5
    moved = r.set_target(r.target_pos + np.array([0.0, 0.15, 0.1]))["image"]
    assert np.abs(moved.astype(int) - img.astype(int)).sum() > 0
    # the red target is visible and its pixels move with it
    red = [np.argwhere((im[..., 0] > 120) & (im[..., 1] < 60) & (im[..., 2] < 60)) for im in (img, moved)]
    assert len(red[0]) and len(red[1])
    assert np.linalg.norm(red[0].mean(0) - red[1].mean(0)) > 3
    assert r.step(np.zeros(3, np.float32)).observation["image"].shape == (64, 64, 3)
    r.close()
    r.close()
    with pytest.raises(RuntimeError):
        r.reset()


def test_state_mode_close_twice(robot):
    robot.reset()
    robot.close()
    robot.close()


def test_the_pixels_variant_puts_targets_on_a_table_seen_from_the_top_camera():
    r = ReachRobot(obs_mode="image", image_size=32, camera="top", targets="table", success_distance=0.05, seed=2)
    assert r.descriptor.cameras == ("top",)
    heights, red = set(), []
    for _ in range(20):
        obs = r.reset()
        heights.add(round(float(r.target_pos[2]), 6))
        image = obs["image"].astype(int)
        red.append(np.argwhere((image[..., 0] > 120) & (image[..., 1] < 60) & (image[..., 2] < 60)).mean(0))
    assert heights == {0.2}
    # Seen from above, the target's pixels say where it is: they move from episode to episode.
    assert np.ptp(np.array(red), axis=0).min() > 4
    touched = []
    for _ in range(5):  # the expert closes in; 4 cm counts as touching at a 5 cm success distance
        r.reset()
        while r.distance > 0.04 and r._step < r.episode_steps:
            result = r.step(r.expert_action())
        touched.append(result.info["is_success"] and result.reward > 0.9)
        assert result.info["is_success"] == (result.info["distance"] < 0.05)
    assert sum(touched) >= 4
    r.close()


def test_two_colours_the_instruction_names_the_target_to_touch():
    """Two targets on the table; each episode's instruction names one, and only touching that one succeeds."""
    from user_rl.hal.instruction import decode_instruction

    r = ReachRobot(obs_mode="image", image_size=32, camera="top", targets="two_colours", success_distance=0.05, seed=4)
    assert r.observation_space["instruction"].shape == (32,) and r.observation_space["state"].shape == (12,)
    said, green_seen = [], 0
    for _ in range(30):
        obs = r.reset()
        said.append(decode_instruction(obs["instruction"]))
        red, green = r.data.mocap_pos[r._target_mocap], r.data.mocap_pos[r._green_mocap]
        assert np.linalg.norm(red - green) >= 0.12 and red[2] == green[2] == 0.2
        goal = red if said[-1] == "touch the red target" else green
        np.testing.assert_array_equal(r.target_pos, goal)
        image = obs["image"].astype(int)
        green_seen += ((image[..., 1] > 120) & (image[..., 0] < 60)).any()
    assert set(said) == {"touch the red target", "touch the green target"}
    assert green_seen >= 25, "the green target is in view (unless the arm hides it)"
    r.close()
    for colour in ("red", "green"):  # the expert touches the named target; touching it ends the episode
        fixed = ReachRobot(targets="two_colours", goal=colour, reward="sparse", seed=5)
        wins = 0
        for _ in range(5):
            obs = fixed.reset()
            assert decode_instruction(obs["instruction"]) == f"touch the {colour} target"
            for _ in range(fixed.episode_steps):
                result = fixed.step(fixed.expert_action())
                if result.terminated or result.truncated:
                    break
            wins += result.terminated and result.info["is_success"]
        assert wins >= 4
        # state mode shows both targets (red, then green), not which one is the goal
        np.testing.assert_allclose(obs["state"][-6:-3], fixed.data.mocap_pos[fixed._target_mocap], atol=1e-6)
        fixed.close()


def test_a_snapshot_restores_the_sim_and_the_episode_step_exactly():
    """What a search over actions from one state needs (bench/steering_room.py)."""
    robot = ReachRobot(episode_steps=6)
    robot.reset(seed=3)
    robot.step(np.array([0.5, -0.5, 0.2]))
    start = robot.snapshot()
    actions = np.random.default_rng(0).uniform(-1, 1, (5, 3))
    first = [robot.step(a) for a in actions]
    assert first[-1].truncated  # the snapshot's step counts: 1 + 5 of 6
    robot.restore(start)
    again = [robot.step(a) for a in actions]
    for one, other in zip(first, again, strict=True):
        assert np.array_equal(one.observation["state"], other.observation["state"]) and one.reward == other.reward
    assert again[-1].truncated
    robot.close()
