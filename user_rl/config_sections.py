"""Each section of a config (`robot:`, `fleet:`, `buffer:` ...): its keys, their defaults
and the checks that need only that section. The sections that name a registered component
(`policy:`, `algo:`, `reward:`) are in `user_rl.config_plugins`; `user_rl.config` puts them all
together into a `Config`."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator


class ConfigError(ValueError):
    """A configuration mistake, phrased for the person who wrote the config."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def without_secrets(data: Any) -> Any:
    """A config's dump with every secret (a `SecretStr` field, e.g. `teleop.token`) left out (None):
    what may be written where others can read it (config.yaml, checkpoints). `model_dump()` keeps
    secrets as `SecretStr`, which print as '**********', so a logged config never shows one."""
    if isinstance(data, SecretStr):
        return None
    if isinstance(data, dict):
        return {key: without_secrets(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(without_secrets(value) for value in data)
    return data


class RobotConfig(Section):
    type: str = "mujoco_reach"
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_driver(self) -> RobotConfig:
        from user_rl.hal.registry import robot_names, robot_option_names

        if self.type not in robot_names():
            raise ValueError(f"unknown robot type {self.type!r}; allowed: {', '.join(robot_names())}")
        names = robot_option_names(self.type)
        if names is None:  # the driver cannot be imported here (e.g. no mujoco on a robot controller)
            return self
        allowed = [n for n in names if n not in ("robot_id", "seed")]
        unknown = sorted(set(self.options) - set(allowed))
        if unknown:
            raise ValueError(f"unknown option {unknown[0]!r} for {self.type}; allowed: {', '.join(allowed)}")
        return self


class CompressionConfig(Section):
    format: Literal["jpeg", "png"] = "jpeg"
    quality: int = Field(90, ge=1, le=100)


class FleetConfig(Section):
    num_robots: int = Field(
        4,
        ge=0,
        le=256,
        description="0: an offline run, the learner alone on buffer.attach until stop.max_updates (resume it "
        "with robots to go on online)",
    )
    control_hz: float = Field(0.0, ge=0.0, description="0 runs sims unthrottled")
    pace_to_learner: bool = Field(
        True, description="sims only: wait for the learner's step credit; a real robot never waits"
    )
    batch_transitions: int = Field(64, ge=1, le=65536)
    max_batch_delay_s: float = Field(0.1, gt=0.0)
    heartbeat_s: float = Field(1.0, gt=0.0)
    spool_max_mb: float = Field(2048.0, gt=0, description="disk for batches the learner has not acked yet")
    spool_fsync: bool | None = Field(
        None, description="fsync every spooled batch; None: on for real robots, off for sims"
    )
    ack_timeout_s: float = Field(
        10.0, gt=0, description="batches waiting and no reply from the learner this long: reconnect"
    )
    max_in_flight: int = Field(64, ge=1, description="batches sent and not yet acked before the edge waits")
    resend_after_s: float = Field(2.0, gt=0, description="no ack progress this long: send again from the last ack")
    compression: dict[str, CompressionConfig] = Field(default_factory=dict, description="per camera key")
    adapt: bool = Field(True, description="grow batches and compress harder while the backlog grows")
    labels: dict[str, str] = Field(default_factory=dict, description="Ray node labels every edge's node must have")
    max_restarts: int = Field(3, ge=0, description="restarts of a dead or unhealthy edge before its robot is failed")
    stall_s: float = Field(
        30.0, gt=0, description="a robot call (reset / step) this long means the robot stopped answering"
    )
    start_timeout_s: float = Field(
        300.0,
        gt=0,
        description="an edge starting up (placing its process, building its robot) "
        "with no progress this long is hung and restarted; a slower start is waited for",
    )
    robot_id_prefix: str = Field("", description="robot ids are <prefix>-<index>; empty: the robot type")


class EdgeConfig(Section):
    """How each edge runs its policy (user_rl/edge/inference.py)."""

    async_chunks: bool = Field(
        True,
        description="a chunk policy infers its next chunk while the current one runs, "
        "so the control loop does not wait on inference",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="where the edge runs its policy (cuda: the controller's GPU)"
    )
    apply_weights: Literal["chunk", "episode"] = Field(
        "chunk",
        description="a new policy version takes over between two chunks (as soon as it arrives), "
        "or only when an episode starts (one policy per episode)",
    )


class InterventionConfig(Section):
    """Who may act instead of the policy on the edges (see user_rl/edge/scripted.py for the rule)."""

    scripted: bool = Field(False, description="sims: an expert takes over when the policy stops making progress")
    patience: int = Field(5, ge=1, description="steps without min_progress before the scripted expert takes over")
    min_progress: float = Field(
        0.01, ge=0.0, description="distance to the goal the policy must gain over patience steps"
    )
    handback_distance: float = Field(0.05, gt=0.0, description="the scripted expert hands back this close to the goal")
    demo_episodes: int = Field(
        0,
        ge=0,
        description="the scripted expert drives each robot's first episodes throughout "
        "(demonstrations before the policy's first try)",
    )
    watched_fraction: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="the fraction of episodes the scripted expert watches (and may take over); "
        "the rest are the policy's",
    )
    teleoperator: dict[str, Any] | None = Field(
        None,
        description="a LeRobot teleoperator as LeRobot configures it, e.g. {type: so101_leader, port: "
        "/dev/ttyACM1, id: leader}; needs user-rl[lerobot] (user_rl/edge/lerobot_teleop.py)",
    )
    teleoperator_drives: Literal["auto", "events", "always"] = Field(
        "auto",
        description="events: while its intervention event is on; always: on every step (a leader arm); "
        "auto: events if the teleoperator has them",
    )
    teleoperator_calibrate: bool = Field(False, description="run LeRobot's (interactive) calibration when it connects")


TELEOP_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,}")


class TeleopConfig(Section):
    """The teleop web page each edge serves for its robot (user_rl/edge/teleop): watch, take over,
    label, reset, emergency stop. Needs the teleop extra (`pip install -e '.[teleop]'`)."""

    enabled: bool = Field(False, description="serve the page (every edge of the fleet serves its own)")
    host: str = Field("127.0.0.1", description="the address to listen on; 0.0.0.0 opens it to the network")
    port: int = Field(
        0, ge=0, le=65535, description="0 picks a free port; else robot i of the fleet listens on port + i"
    )
    token: SecretStr | None = Field(
        None,
        description="needed by every request; default: $USER_RL_TELEOP_TOKEN, "
        "else a random one, printed at start; never written to config.yaml, checkpoints or logs",
    )
    frame_hz: float = Field(10.0, gt=0, le=60, description="camera frames per second sent to people watching")
    view_size: int = Field(160, ge=16, le=1024, description="pixels of the rendered view of a sim without cameras")
    speed: float = Field(
        0.5,
        gt=0,
        le=1,
        description="a held key's share of a step: of the per-step limit for "
        "absolute-position robots, of half the action range for others",
    )
    command_timeout_s: float = Field(
        0.5, gt=0, description="a held key's command not refreshed this long stops the robot"
    )
    hand_back_after_s: float = Field(
        10.0,
        ge=0,
        description="a driver whose page lost its connection leaves the robot "
        "holding still this long, then the policy acts again",
    )
    operators_file: str | None = Field(
        None,
        description="`NAME TOKEN` lines (owner-only file) of the operators who "
        "may re-arm an e-stop from the page; none: only `user-rl rearm`",
    )
    idle_hand_back_s: float = Field(
        10.0,
        ge=0,
        description="a driver who commands no motion (holds no key, stick or button) this long is handed "
        "back: the policy acts again and the page says why; 0: never",
    )
    label_undo_s: float = Field(
        2.0,
        ge=0,
        le=10,
        description="a success or failure pressed on the page is sent this long after (Z or the gamepad's X undoes "
        "it meanwhile), or at once when the episode would end first; 0: sent at once",
    )
    slow_loop_hz: float = Field(
        10.0,
        ge=0,
        description="the page warns when the robot's loop steps slower than this (a person cannot drive it smoothly)",
    )
    idle_rows: Literal["keep", "downweight", "drop"] = Field(
        "drop",
        description="steps on which the driver held nothing (the robot only held still): sampled as "
        "demonstrations like the others (keep), idle_weight times as often (downweight), or never (drop); "
        "they stay stored either way",
    )
    idle_weight: float = Field(0.1, gt=0, lt=1, description="idle_rows: downweight: how much an idle step counts")

    @field_validator("token")
    @classmethod
    def _strong_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not TELEOP_TOKEN.fullmatch(value.get_secret_value()):
            raise ValueError("must be at least 16 characters of A-Z a-z 0-9 _ - (it travels in URLs)")
        return value


class AttachConfig(Section):
    """An earlier run's buffer, read-only, filtered; its transitions join the sampling."""

    path: str
    source: Literal["online", "demo", "intervention"] = "online"
    tasks: list[str] | None = None
    robots: list[str] | None = None
    min_policy_version: int | None = None


class BufferConfig(Section):
    ram_budget_mb: float = Field(2048.0, gt=0, description="RAM for cached segments")
    segment_mb: float = Field(32.0, gt=0, description="target size of one segment file")
    max_disk_gb: float = Field(0.0, ge=0, description="0: no limit; else evict oldest online segments")
    commit_interval_s: float = Field(0.05, ge=0, description="group commit: fsync and ack this often")
    hot_segments: int = Field(2, ge=0, description="newest sealed segments always kept in RAM")
    batches_per_swap: int = Field(
        64,
        ge=1,
        description="beyond ram_budget_mb: batches drawn between two cold segments swapped into RAM (fewer: faster "
        "rotation, more disk reads and a longer tail per batch; at 64 with 32 MB segments and batches of 256, "
        "a segment is read for every 16k transitions drawn)",
    )
    strategy: Literal["uniform", "recency", "task_balanced"] = "uniform"
    recency_half_life: int = Field(50_000, ge=1)
    mix: dict[str, float] | None = Field(None, description="e.g. {online: 0.5, demo: 0.5} (RLPD)")
    n_step: int = Field(
        1,
        ge=1,
        le=64,
        description="rewards summed per transition; an algorithm that sums over chunks (qc) uses policy.chunk",
    )
    action_horizon: int = Field(
        1,
        ge=1,
        le=128,
        description="future actions sampled per row (action_chunk, chunk_mask); the run uses policy.chunk",
    )
    max_policy_lag: int | None = Field(
        None, ge=0, description="versions a row's policy may lag the newest on arrival to be used as is; None: no limit"
    )
    stale_data: Literal["downweight", "drop"] = Field(
        "downweight", description="rows past max_policy_lag: drawn stale_weight times as often, or never"
    )
    stale_weight: float = Field(0.25, gt=0, lt=1, description="how likely a stale row is drawn, against a fresh one")
    idle_rows: Literal["keep", "downweight", "drop"] = Field(
        "drop", description="a run takes it from teleop.idle_rows: rows flagged idle (a person drove, held nothing)"
    )
    idle_weight: float = Field(0.1, gt=0, lt=1, description="a run takes it from teleop.idle_weight")
    attach: list[AttachConfig] = Field(default_factory=list)
    scrub: bool = Field(True, description="verify sealed segments' checksums in the background after start-up")


class LearnerConfig(Section):
    publish_every_s: float | None = Field(
        0.1,
        gt=0,
        description="hand the edges a new actor this often (seconds): a small one reaches them within a control "
        "period or two, however fast the updates go",
    )
    publish_every_updates: int | None = Field(
        None, ge=1, description="also (or instead, with publish_every_s null) after this many updates"
    )
    publish_max_bytes_per_s: float | None = Field(
        2e6,
        gt=0,
        description="at most this many bytes of actor a second to each edge: a big actor (a VLA) goes out less "
        "often than publish_every_s; null: no cap",
    )
    torch_threads: int = Field(0, ge=0, description="0 picks what the fleet leaves free")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    cuda_graph: bool = Field(
        True,
        description="on a GPU, capture the update once as a CUDA graph and replay it for every batch (many times "
        "the updates per second of small networks); false runs each update as written",
    )
    compile: bool = Field(
        False,
        description="on a GPU, torch.compile the update before it is captured: fewer, fused kernels per update "
        "(about 1.6x SAC's rate with small networks), after a minute or so of compiling when the learner starts",
    )
    weight_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="what the actor's floats travel as: half the bytes in bfloat16 or float16"
    )
    host: str = "127.0.0.1"
    start_timeout_s: float = Field(
        600.0,
        gt=0,
        description="a learner not started this long (Ray placing its process, the learner opening its "
        "buffer and sockets) stops the run with why, instead of waiting for ever",
    )
    data_port: int = Field(
        0, ge=0, le=65535, description="0 picks a free port; fix it so edges survive a learner restart"
    )
    weights_port: int = Field(0, ge=0, le=65535)
    weight_claim_timeout_s: float = Field(
        15.0,
        gt=0,
        description="an edge that takes none of a replaced version's bytes this long stops holding its "
        "buffer (it re-fetches later): hung edges cannot stop publishing",
    )
    checkpoint_every_s: float = Field(60.0, gt=0, description="background checkpoints, written without pausing")
    tensorboard_every_s: float = Field(10.0, ge=0, description="TensorBoard points in <run>/tensorboard; 0: none")
    max_messages_per_s: float = Field(2000.0, gt=0, description="per robot connection; more are dropped unread")
    max_message_mb: float = Field(64.0, gt=0, description="a bigger message disconnects its sender")
    prefetch_batches: int = Field(
        4, ge=1, le=64, description="sampled batches kept ready in shared memory for the trainer process"
    )
    max_robots: int = Field(1024, ge=1, description="robots the learner keeps state for; idle ones age out first")
    forget_idle_s: float = Field(
        600.0, gt=0, description="a robot not heard from this long leaves memory and the status"
    )
    resources: dict[str, float] = Field(default_factory=dict, description="Ray resources the learner's node must have")
    labels: dict[str, str] = Field(default_factory=dict, description="Ray node labels the learner's node must have")

    @model_validator(mode="after")
    def _publishes_at_all(self) -> LearnerConfig:
        if self.publish_every_s is None and self.publish_every_updates is None:
            raise ValueError(
                "learner: publish_every_s and publish_every_updates are both null, so the edges would never "
                "get a new actor; set one (publish_every_s: 0.1 is the default)"
            )
        return self


class SafetyConfig(Section):
    max_action_delta: float | None = Field(
        None,
        gt=0,
        description="most an action component may change per step "
        "(absolute-position robots: from the current pose, and by default "
        "their action range in 2 s)",
    )
    deadline_s: float = Field(1.0, ge=0, description="no action this long: the robot holds (0: no watchdog)")


class SecurityConfig(Section):
    curve: Literal["auto", "on", "off"] = Field(
        "auto", description="CurveZMQ on every link; auto: on unless the learner listens on loopback only"
    )
    keys_dir: str = Field(
        "keys", description="made by `user-rl keys generate`; edges need robots/<id>.key_secret and learner.key"
    )

    @field_validator("curve", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: Any) -> Any:
        """YAML reads a bare on / off as true / false."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class StopConfig(Section):
    max_env_steps: int = Field(200_000, ge=1)
    max_updates: int | None = Field(
        None, ge=1, description="stop once the learner has made this many updates, offline ones included"
    )
    max_wall_s: float = Field(1800.0, gt=0.0)
    eval_every_s: float | None = Field(
        20.0,
        gt=0.0,
        description="evaluations, goal or not (the learning curve); null: only the final one (a goal then needs one)",
    )
    eval_every_env_steps: int | None = Field(
        None,
        ge=1,
        description="also evaluate at every multiple of this many env steps (a learning curve at "
        "the same env steps as another library's). A paced fleet holds at each one, and "
        "the evaluation waits for the updates those steps earn (algo.utd_ratio), so each "
        "point is exact; so does the final one at stop.max_env_steps. A point before "
        "algo.learning_starts ends the edges' random warm-up (they act with the actor it "
        "publishes)",
    )
    eval_episodes: int = Field(20, ge=1)
    success_rate: float | None = Field(None, ge=0.0, le=1.0)
    confirm_evals: int = Field(
        1, ge=1, description="consecutive evaluations, each on new episodes, that must meet the goal"
    )
    mean_return: float | None = None
    eval_beside_training: bool = Field(
        True,
        description="the learning curve's evaluations run while the learner and the fleet go on (they pause "
        "only for the snapshot); a run with a goal, and the final evaluation, keep the learner paused while "
        "they evaluate, so the checkpoint left is the version evaluated",
    )

    @property
    def evaluates_beside_training(self) -> bool:
        """Whether the scheduled evaluations run beside the training (not while a goal is set)."""
        return self.eval_beside_training and self.success_rate is None and self.mean_return is None

    @model_validator(mode="after")
    def _goal_needs_evaluations(self) -> StopConfig:
        no_schedule = self.eval_every_s is None and self.eval_every_env_steps is None
        if no_schedule and (self.success_rate is not None or self.mean_return is not None):
            raise ValueError("stop.eval_every_s is null but stop names a goal: a goal is checked by evaluations")
        return self

    def next_eval_steps(self, env_steps: int) -> int | None:
        """The first multiple of `eval_every_env_steps` after `env_steps` (None: no such schedule)."""
        every = self.eval_every_env_steps
        return None if every is None else (env_steps // every + 1) * every
