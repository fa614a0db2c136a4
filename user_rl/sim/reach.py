"""A MuJoCo arm that must touch a red target: the project's own sim robot, in two arm models.

`arm="3dof"` (assets/reach_arm.xml) has base yaw, shoulder pitch and elbow pitch, 0.25 m links;
`arm="4dof"` (assets/reach_arm4.xml) adds a wrist pitch, with 0.2 / 0.2 / 0.1 m links. Both have
stiff position servos and differ in observation and action spaces (a heterogeneous fleet). An action
is a vector of joint-position deltas in [-1, 1] (x 0.1 rad), like the relative joint commands a real
arm's driver accepts, so a policy trained here talks to a real arm the same way. Every episode draws
a new start pose and a new target.
"""

from __future__ import annotations

import os
import time

# MuJoCo picks its OpenGL backend when `mujoco` is first imported, so headless rendering must be
# chosen before that import. Only a default: a caller's MUJOCO_GL (e.g. osmesa) wins.
os.environ.setdefault("MUJOCO_GL", "egl")

from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import gymnasium as gym  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from user_rl.hal.action import ActionMode  # noqa: E402
from user_rl.hal.descriptor import DeviceDescriptor  # noqa: E402
from user_rl.hal.instruction import INSTRUCTION, encode_instruction, instruction_space  # noqa: E402
from user_rl.hal.robot import Observation, Robot, StepResult  # noqa: E402

ASSETS = Path(__file__).parent / "assets"

ACTION_SCALE = 0.1  # rad of joint motion per unit action per control step
SUCCESS_DISTANCE = 0.02  # m between fingertip and target centre
SUCCESS_BONUS = 1.0
QVEL_SCALE = 0.2  # joint velocities (rad/s) are a few units; scale them to about [-1, 1]
MAX_EPISODE_STEPS = 1000  # 50 s at 20 Hz: long enough for a person driving from the teleop page

# Where targets appear: a slice of a cylinder around the base axis, 0.30+ m across.
TARGET_YAW = (-np.pi / 3, np.pi / 3)
TARGET_RADIUS = (0.15, 0.40)
TARGET_HEIGHT = (0.05, 0.30)
# Where the fingertip may go: a box around the 0.5 m reach, above the floor.
WORKSPACE = ((-0.55, 0.55), (-0.55, 0.55), (0.0, 0.65))
MIN_START_HEIGHT = 0.06  # fingertip and joint height (m) a start pose must keep


@dataclass(frozen=True)
class ArmModel:
    """One arm: its MJCF file and the joint ranges start poses are drawn from (one per joint)."""

    asset: str
    start_low: tuple[float, ...]
    start_high: tuple[float, ...]


# Start poses: (yaw, shoulder, elbow[, wrist]) ranges; poses that put the arm near the floor are redrawn.
ARMS = {
    "3dof": ArmModel("reach_arm.xml", (-np.pi / 2, 0.0, 0.2), (np.pi / 2, 1.0, 1.8)),
    "4dof": ArmModel("reach_arm4.xml", (-np.pi / 2, 0.0, 0.2, -1.0), (np.pi / 2, 1.0, 1.8, 1.0)),
}
MIN_START_DISTANCE = 0.10  # a start pose this close to the target is redrawn (no free successes)


def reach_reward(distance: float, success_distance: float = SUCCESS_DISTANCE) -> float:
    """Dense shaping: minus the distance in metres, plus a bonus while the target is touched."""
    return -distance + (SUCCESS_BONUS if distance < success_distance else 0.0)


REWARDS = ("dense", "sparse")  # sparse: 1 when the target is touched (which ends the episode), else 0
EXPERT_DAMPING = 0.05  # damped least squares: smooth joint steps near singular poses


# table: every target at TABLE_HEIGHT, so a camera from above sees all of it; two_colours: a red and a
# green target on the table, and the episode's instruction names the one to touch
TARGETS = ("volume", "table", "two_colours")
GOALS = ("random", "red", "green")  # two_colours: which target an episode's instruction names
COLOUR_SEPARATION = 0.12  # m between the two targets' centres at least
BELOW_FLOOR = np.array([0.3, 0.0, -1.0])  # where the green target waits when it is not used
TABLE_HEIGHT = 0.20  # 0.1 m above the shoulder: the arm reaches all of it without folding tight
CAMERAS = ("front", "top")


def sample_target(rng: np.random.Generator, targets: str = "volume") -> np.ndarray:
    """A target position (m) uniform in yaw, radius and height within the declared workspace."""
    yaw = rng.uniform(*TARGET_YAW)
    radius = rng.uniform(*TARGET_RADIUS)
    height = rng.uniform(*TARGET_HEIGHT) if targets == "volume" else TABLE_HEIGHT
    return np.array([radius * np.cos(yaw), radius * np.sin(yaw), height])


def _make_renderer(model: mujoco.MjModel, size: int) -> mujoco.Renderer:
    """An offscreen renderer, or an error that says how to fix the usual headless failure."""
    try:
        return mujoco.Renderer(model, size, size)
    except Exception as exc:  # mujoco.FatalError, or ImportError of the GL backend
        raise RuntimeError(
            f"offscreen rendering failed ({exc}). MuJoCo reads MUJOCO_GL (now"
            f" {os.environ.get('MUJOCO_GL')!r}) only when `mujoco` is first imported: set"
            " MUJOCO_GL=egl (or osmesa) in the environment, or import user_rl.sim before mujoco"
        ) from exc


class ReachRobot(Robot):
    """Fingertip-to-target reaching with a 3- or 4-joint arm, state or state+image observations
    (in image mode the state holds only the arm: the target is seen, not told)."""

    device_kind = "sim"
    action_mode = ActionMode.DELTA  # a step of the joint targets (0.1 rad x action): zero stays

    def __init__(
        self,
        *,
        robot_id: str = "reach-0",
        arm: str = "3dof",
        obs_mode: str = "state",
        image_size: int = 64,
        episode_steps: int = 50,
        control_hz: float = 25.0,
        extra_cameras: tuple[str, ...] = (),
        seed: int | None = None,
        reward: str = "dense",
        camera: str = "front",
        targets: str = "volume",
        success_distance: float = SUCCESS_DISTANCE,
        goal: str = "random",
    ) -> None:
        """`camera`: what the `image` observation shows; `extra_cameras` (e.g. ("top",)) add
        `image_<name>` observations beside it. `reward="sparse"`: 1 on touching the target, which
        ends the episode (terminated), else 0. `targets="table"`: targets on one plane (the pixels
        variant: seen from the top camera, the image says where the target is).
        `success_distance` (m): how close counts as touching. `targets="two_colours"`: a red and a
        green target on the table; each episode's `instruction` observation names the goal (`goal`:
        random per episode, or always red / green), and only touching that one succeeds."""
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {reward!r}")
        if targets not in TARGETS:
            raise ValueError(f"targets must be one of {', '.join(TARGETS)}, got {targets!r}")
        if goal not in GOALS:
            raise ValueError(f"goal must be one of {', '.join(GOALS)}, got {goal!r}")
        if goal != "random" and targets != "two_colours":
            raise ValueError(f"goal {goal!r} chooses between two targets: it needs targets='two_colours'")
        self.goal = goal
        if camera not in CAMERAS:
            raise ValueError(f"camera must be one of {', '.join(CAMERAS)}, got {camera!r}")
        if not 0.005 <= success_distance <= 0.2:
            raise ValueError(f"success_distance must be in [0.005, 0.2] m, got {success_distance}")
        self.targets = targets
        self.success_distance = success_distance
        self.sparse = reward == "sparse"
        if arm not in ARMS:
            raise ValueError(f"unknown arm {arm!r}; allowed: {', '.join(ARMS)}")
        if obs_mode not in ("state", "image"):
            raise ValueError(f"obs_mode must be 'state' or 'image', got {obs_mode!r}")
        if not 1 <= episode_steps <= MAX_EPISODE_STEPS:
            raise ValueError(f"episode_steps must be in 1..{MAX_EPISODE_STEPS}, got {episode_steps}")
        if not 0 < control_hz <= 100:  # at least a few 2 ms physics steps per control step
            raise ValueError(f"control_hz must be in (0, 100], got {control_hz}")
        if not 8 <= image_size <= 512:
            raise ValueError(f"image_size must be in 8..512, got {image_size}")
        unknown = sorted(set(extra_cameras) - set(CAMERAS) | set(extra_cameras) & {camera})
        if unknown:
            raise ValueError(
                f"extra camera {unknown[0]!r}: the arm's other cameras are "
                f"{', '.join(c for c in CAMERAS if c != camera)} (`camera` shows {camera!r})"
            )
        if extra_cameras and obs_mode != "image":
            raise ValueError("extra_cameras need obs_mode='image'")
        self.obs_mode = obs_mode
        self.image_size = image_size
        self.cameras = {"image": camera, **{f"image_{name}": name for name in extra_cameras}}
        self.episode_steps = episode_steps

        self.arm = ARMS[arm]
        self.model = mujoco.MjModel.from_xml_path(str(ASSETS / self.arm.asset))
        self.data = mujoco.MjData(self.model)
        self._scratch = mujoco.MjData(self.model)  # forward kinematics of predicted poses
        self.holds: list[float] = []  # when the watchdog held the arm
        # Physics substeps so that one control step lasts 1 / control_hz of simulated time.
        self.n_substeps = max(1, round(1.0 / (control_hz * self.model.opt.timestep)))
        self._qlow = self.model.jnt_range[:, 0].copy()
        self._qhigh = self.model.jnt_range[:, 1].copy()
        self._ee = self.model.site("ee").id
        # Every moving joint above the shoulder (elbow, wrist) must start clear of the floor.
        # (the bodies below the upper arm: world is body 0, the base 1, the upper arm 2).
        self._upper_joints = [b for b in range(self.model.nbody) if self.model.body_parentid[b] > 1]
        self._target_mocap = self.model.body_mocapid[self.model.body("target").id]  # the red one
        self._green_mocap = self.model.body_mocapid[self.model.body("target_green").id]
        self._goal_mocap = self._target_mocap  # the target this episode asks for
        self._instruction = encode_instruction("")  # two_colours: this episode's, set at reset
        self._rng = np.random.default_rng(seed)
        self._step = -1  # -1: no episode yet
        self._closed = False

        # sin, cos, velocity per joint; the fingertip; in state mode also the target and target - ee
        # (two_colours: both targets, red then green; the instruction says which is the goal).
        # In image mode the targets are only in the pixels: a policy that reaches one must see it.
        n_state = 3 * self.model.nq + (3 if obs_mode == "image" else 9)
        spaces: dict[str, gym.spaces.Space] = {"state": gym.spaces.Box(-np.inf, np.inf, (n_state,), np.float32)}
        if targets == "two_colours":
            spaces[INSTRUCTION] = instruction_space()
        self._renderer: mujoco.Renderer | None = None
        self._view_renderer: mujoco.Renderer | None = None  # `render()` for people watching
        if obs_mode == "image":
            vis = self.model.vis.global_
            vis.offwidth, vis.offheight = max(vis.offwidth, image_size), max(vis.offheight, image_size)
            self._renderer = _make_renderer(self.model, image_size)
            for key in self.cameras:
                spaces[key] = gym.spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (self.model.nu,), np.float32)
        self.action_names, self.state_names = self._names()
        self.descriptor = DeviceDescriptor(
            kind="sim",
            model=f"reach_arm_{arm}",
            id=robot_id,
            control_hz=control_hz,
            instruction="move the fingertip to the red target"
            if targets != "two_colours"
            else "move the fingertip to the target the instruction names",
            cameras=tuple(self.cameras.values()) if obs_mode == "image" else (),
            joint_limits=tuple((float(lo), float(hi)) for lo, hi in self.model.jnt_range),
            workspace=WORKSPACE,
        )

    # -- episode -------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> Observation:
        """New random start pose and target; `seed` restarts the generator for reproducibility."""
        self._check_open()
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        target = self._place_targets()
        while True:  # rejection sampling; a handful of tries at most
            d.qpos[:] = self._rng.uniform(self.arm.start_low, self.arm.start_high)
            mujoco.mj_kinematics(m, d)
            ee = d.site_xpos[self._ee]
            if (
                min(ee[2], *d.xpos[self._upper_joints, 2]) >= MIN_START_HEIGHT
                and np.linalg.norm(ee - target) >= MIN_START_DISTANCE
            ):
                break
        d.ctrl[:] = d.qpos  # the servos hold the start pose
        mujoco.mj_forward(m, d)
        self._step = 0
        return self._observation()

    def _place_targets(self) -> np.ndarray:
        """Draw this episode's target(s) and goal; returns the goal's position."""
        d = self.data
        red = sample_target(self._rng, self.targets)
        green = BELOW_FLOOR
        if self.targets == "two_colours":
            green = sample_target(self._rng, self.targets)
            while np.linalg.norm(green - red) < COLOUR_SEPARATION:
                green = sample_target(self._rng, self.targets)
            colour = self.goal if self.goal != "random" else ("red", "green")[int(self._rng.integers(2))]
            self._goal_mocap = self._target_mocap if colour == "red" else self._green_mocap
            self._instruction = encode_instruction(f"touch the {colour} target")
        d.mocap_pos[self._target_mocap], d.mocap_pos[self._green_mocap] = red, green
        return d.mocap_pos[self._goal_mocap].copy()

    def step(self, action: np.ndarray) -> StepResult:
        """Move the joint targets by 0.1 rad x action, simulate 1 / control_hz seconds."""
        self._check_open()
        if self._step < 0:
            raise RuntimeError("call reset() before step()")
        if self._step >= self.episode_steps:
            raise RuntimeError("the episode is over (truncated); call reset()")
        applied = np.clip(np.asarray(action, dtype=np.float32).reshape(self.action_space.shape), -1.0, 1.0)
        applied = np.nan_to_num(applied, nan=0.0)  # a NaN command must never reach the servos
        m, d = self.model, self.data
        d.ctrl[:] = np.clip(d.qpos + ACTION_SCALE * applied, self._qlow, self._qhigh)
        mujoco.mj_step(m, d, nstep=self.n_substeps)
        self._step += 1
        distance = self.distance
        touched = distance < self.success_distance
        return StepResult(
            observation=self._observation(),
            reward=float(touched) if self.sparse else reach_reward(distance, self.success_distance),
            terminated=self.sparse and touched,
            truncated=self._step >= self.episode_steps,
            action_applied=applied,
            info={"distance": distance, "is_success": touched},
        )

    def predict(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Joint targets of `action` (before the servos' own range clip) and the fingertip there."""
        targets = self.data.qpos + ACTION_SCALE * np.asarray(action, np.float64).reshape(self.model.nu)
        self._scratch.qpos[:] = targets
        mujoco.mj_kinematics(self.model, self._scratch)
        return targets, self._scratch.site_xpos[self._ee].copy()

    def expert_action(self) -> np.ndarray:
        """A scripted expert's action (it knows the target): the damped least-squares joint step that
        moves the fingertip straight at the target, clipped to the action space. It touches a
        target from any start pose well within an episode (tests/sim/test_sim_reach.py)."""
        jacobian = np.zeros((3, self.model.nv))
        mujoco.mj_jacSite(self.model, self.data, jacobian, None, self._ee)
        error = self.target_pos - self.ee_pos
        gram = jacobian @ jacobian.T + EXPERT_DAMPING**2 * np.eye(3)
        step = jacobian.T @ np.linalg.solve(gram, error)
        return np.clip(step / ACTION_SCALE, -1.0, 1.0).astype(np.float32)

    def render(self, size: int = 240, camera: str = "front") -> np.ndarray:
        """The scene as people see it (uint8 HWC), for a sim without camera observations. Call it
        from the thread that steps the sim (the GL context belongs to it)."""
        self._check_open()
        if self._view_renderer is None:
            vis = self.model.vis.global_
            vis.offwidth, vis.offheight = max(vis.offwidth, size), max(vis.offheight, size)
            self._view_renderer = _make_renderer(self.model, size)
        self._view_renderer.update_scene(self.data, camera=camera)
        return self._view_renderer.render()

    def hold(self) -> None:
        """The servos keep the current pose (what a stalled policy gets from the watchdog)."""
        self.data.ctrl[:] = self.data.qpos
        self.holds.append(time.monotonic())

    def close(self) -> None:
        """Free the renderer's GL context; safe to call twice."""
        for renderer in (self._renderer, self._view_renderer):
            if renderer is not None:
                renderer.close()
        self._renderer = self._view_renderer = None
        self._closed = True

    # -- state ---------------------------------------------------------------------------

    @property
    def ee_pos(self) -> np.ndarray:
        return self.data.site_xpos[self._ee].copy()

    @property
    def target_pos(self) -> np.ndarray:
        """The goal's position (two_colours: the target the instruction names)."""
        return self.data.mocap_pos[self._goal_mocap].copy()

    @property
    def distance(self) -> float:
        return float(np.linalg.norm(self.data.site_xpos[self._ee] - self.data.mocap_pos[self._goal_mocap]))

    def distance_to_goal(self) -> float:
        """The fingertip's distance to the target (m): how the scripted intervener judges progress."""
        return self.distance

    def snapshot(self) -> tuple[np.ndarray, int]:
        """The simulation's whole state and the episode's step: `restore` goes back to it (a search
        that tries several actions from one state, as bench/steering_room.py does)."""
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        state = np.empty(mujoco.mj_stateSize(self.model, spec))
        mujoco.mj_getState(self.model, self.data, state, spec)
        return state, self._step

    def restore(self, snapshot: tuple[np.ndarray, int]) -> None:
        state, self._step = snapshot
        mujoco.mj_setState(self.model, self.data, state, mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_forward(self.model, self.data)

    def set_target(self, position: np.ndarray) -> Observation:
        """Move the goal target (for scripted scenes and tests) and return the new observation."""
        self._check_open()
        self.data.mocap_pos[self._goal_mocap] = position
        mujoco.mj_forward(self.model, self.data)
        return self._observation()

    def _names(self) -> tuple[list[str], list[str]]:
        """The actuators' names and each entry of `state` by name, in `_observation`'s order (what the
        teleop page shows a person instead of `action[0]` and bare numbers)."""
        joints = [mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in range(self.model.nq)]
        actuators = [mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_ACTUATOR, a) for a in range(self.model.nu)]
        xyz = lambda what: [f"{what}.{axis}" for axis in "xyz"]  # noqa: E731
        state = [f"{j}.sin" for j in joints] + [f"{j}.cos" for j in joints] + [f"{j}.vel" for j in joints]
        state += xyz("fingertip")
        if self.obs_mode != "image" and self.targets == "two_colours":
            state += xyz("red_target") + xyz("green_target")
        elif self.obs_mode != "image":
            state += xyz("target") + xyz("to_target")
        return actuators, state

    def _observation(self) -> Observation:
        d = self.data
        ee = d.site_xpos[self._ee]
        parts = [np.sin(d.qpos), np.cos(d.qpos), QVEL_SCALE * d.qvel, ee]
        if self.obs_mode != "image" and self.targets == "two_colours":
            parts += [d.mocap_pos[self._target_mocap], d.mocap_pos[self._green_mocap]]
        elif self.obs_mode != "image":
            target = d.mocap_pos[self._goal_mocap]
            parts += [target, target - ee]
        state = np.concatenate(parts).astype(np.float32)
        obs = {"state": state}
        if self.targets == "two_colours":
            obs[INSTRUCTION] = self._instruction.copy()
        if self._renderer is not None:
            for key, camera in self.cameras.items():
                self._renderer.update_scene(d, camera=camera)
                obs[key] = self._renderer.render()
        return obs

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"robot {self.descriptor.id!r} is closed")
