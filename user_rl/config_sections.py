"""Each section of a config (`robot:`, `fleet:`, `policy:`, `algo:` ...): its keys, their defaults
and the checks that need only that section. `user_rl.config` puts them together into a `Config`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from user_rl import plugins
from user_rl.config_plugins import (
    BUILTIN_ALGOS,
    BUILTIN_POLICIES,
    BUILTIN_REWARDS,
    checked_plugin_options,
    installed,
    plugin_algo_settings,
)


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


def settings_of_other_types(section: BaseModel) -> list[tuple[str, tuple[str, ...]]]:
    """(key, the types it belongs to) for each of the section's `ONLY_FOR` keys that is changed from
    its default although the section's `type` is none of its owners."""
    defaults = type(section).model_fields
    return [
        (key, owners)
        for key, owners in section.ONLY_FOR.items()
        if section.type not in owners and getattr(section, key) != defaults[key].default
    ]


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
    num_robots: int = Field(4, ge=1, le=256)
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

    @field_validator("token")
    @classmethod
    def _strong_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not TELEOP_TOKEN.fullmatch(value.get_secret_value()):
            raise ValueError("must be at least 16 characters of A-Z a-z 0-9 _ - (it travels in URLs)")
        return value


class RewardConfig(Section):
    """Which reward the run learns from, decided on each edge before a row is recorded (user_rl/rewards/).
    With labels or classifier, the environment's own reward never leaves the edge."""

    type: str = Field(
        "env",
        description="env: the environment's reward; labels: 1 on a row labelled success (person or env), "
        "else 0; classifier: 1 where a learned success classifier judges the observation a success "
        "(which ends the episode), else 0; or a reward an installed package adds "
        "(entry-point group user_rl.rewards)",
    )
    classifier: str | None = Field(None, description="classifier: the file `user-rl reward train` wrote")
    threshold: float = Field(0.5, gt=0.0, lt=1.0, description="classifier: P(success) from which a step is a success")
    keys: list[str] | None = Field(
        None, description="classifier: observation keys it reads (default: those it was trained on)"
    )

    @field_validator("type")
    @classmethod
    def _installed_reward(cls, value: str) -> str:
        return installed("reward", plugins.REWARDS, BUILTIN_REWARDS, value)

    @field_validator("classifier")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        """Edges may run in another working directory (Ray workers): the path is fixed where the config is read."""
        return None if value is None else str(Path(value).expanduser().resolve())

    @model_validator(mode="after")
    def _classifier_settings(self) -> RewardConfig:
        if self.type == "classifier" and self.classifier is None:
            raise ValueError("reward.classifier: reward.type classifier needs the classifier file's path")
        if self.type != "classifier":
            for key in ("classifier", "keys"):
                if getattr(self, key) is not None:
                    raise ValueError(f"reward.{key} is a setting of reward.type classifier; this run's is {self.type}")
        return self


class PolicyConfig(Section):
    """The network edges run (`user_rl.policies.ACTORS`) and what it is built from."""

    type: str = Field(
        "mlp",
        description="mlp: a Gaussian actor (sac, drq, bc); flow: a flow-matching policy that outputs "
        "chunks of `chunk` actions (bc, qc); vla: images + instruction + state through a "
        "transformer, into flow chunks (bc, qc); lerobot: a LeRobot ACT or diffusion policy (bc); "
        "or a policy an installed package adds (entry-point group user_rl.policies)",
    )
    hidden: list[int] = Field(default_factory=lambda: [256, 256], description="vla: its flow head's (default: by size)")
    size: Literal["tiny", "100m", "500m"] = Field("tiny", description="vla: the backbone's named size")
    freeze: list[str] = Field(
        default_factory=list,
        description="parameter-name prefixes kept fixed in training, e.g. [encoder]: a pretrained backbone",
    )
    chunk: int = Field(
        1,
        ge=1,
        le=128,
        description="flow: actions per inferred chunk (H), the edge infers once per "
        "chunk; lerobot: ACT's chunk_size, diffusion's horizon",
    )
    flow_steps: int = Field(10, ge=1, le=100, description="flow: Euler steps from noise to a chunk")
    best_of: int = Field(
        1,
        ge=1,
        le=256,
        description="flow: chunks sampled per inference, of which the chunk critic "
        "picks one (Q-chunking; algo qc needs more than 1)",
    )
    weights: str | None = Field(None, description="initial actor weights: a .safetensors file or a run's checkpoint.pt")
    lerobot: dict[str, Any] | None = Field(
        None,
        description="lerobot: {type: act|diffusion, <its config fields>} or "
        "{path: <a directory LeRobot's save_pretrained wrote>}",
    )

    ONLY_FOR: ClassVar[dict[str, tuple[str, ...]]] = {
        "chunk": ("flow", "vla", "lerobot"),
        "flow_steps": ("flow", "vla"),
        "best_of": ("flow", "vla"),
        "size": ("vla",),
        "lerobot": ("lerobot",),
    }

    @field_validator("type")
    @classmethod
    def _installed_policy(cls, value: str) -> str:
        return installed("policy", plugins.POLICIES, BUILTIN_POLICIES, value)

    @model_validator(mode="after")
    def _settings_of_the_chosen_policy(self) -> PolicyConfig:
        for key, owners in settings_of_other_types(self):
            raise ValueError(
                f"policy.{key} is a setting of policy.type {' or '.join(owners)}; this policy is {self.type}"
            )
        if self.type == "lerobot":
            if not self.lerobot or ("type" in self.lerobot) == ("path" in self.lerobot):
                raise ValueError(
                    "policy.lerobot: give its type (act or diffusion, with LeRobot's config fields) or "
                    "path (a directory LeRobot's save_pretrained wrote)"
                )
            if "hidden" in self.model_fields_set:
                raise ValueError("policy.hidden: a LeRobot policy's sizes are fields of policy.lerobot")
        return self

    @property
    def chunked(self) -> bool:
        return self.type in ("flow", "vla", "lerobot")

    @field_validator("weights")
    @classmethod
    def _absolute_weights(cls, value: str | None) -> str | None:
        """The learner may run in another working directory (a Ray worker)."""
        return None if value is None else str(Path(value).expanduser().resolve())

    @field_validator("lerobot")
    @classmethod
    def _absolute_lerobot_path(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None or "path" not in value:
            return value
        return {**value, "path": str(Path(value["path"]).expanduser().resolve())}

    def summary(self) -> dict[str, Any]:
        """The type and the settings changed from their defaults (for messages)."""
        return {"type": self.type, **self.model_dump(exclude_defaults=True, exclude={"type"})}

    def options(self) -> dict[str, Any]:
        """The keyword arguments `make_actor(type, obs_space, action_space, **options)` takes."""
        if self.type == "lerobot":
            return {
                "chunk": self.chunk,
                "lerobot": dict(self.lerobot or {}),
                **({"freeze": list(self.freeze)} if self.freeze else {}),
            }
        options: dict[str, Any] = {"hidden": self.hidden}
        if self.chunked:
            options.update(chunk=self.chunk, flow_steps=self.flow_steps, best_of=self.best_of)
        if self.type == "vla":
            options["size"] = self.size
            if "hidden" not in self.model_fields_set:
                options["hidden"] = None  # the size's own head
        if self.freeze:
            options["freeze"] = list(self.freeze)
        return options


class AlgoConfig(Section):
    """The learning algorithm and its settings. `type` names one of `user_rl.algos.ALGOS` or an
    installed package's algorithm. Each algorithm reads the fields of its own settings dataclass
    (`SACSettings`, `BCSettings`) from here by name; a plugin's other settings come from `options`."""

    type: str = Field(
        "sac",
        description="sac: soft actor-critic (RLPD with critic_layer_norm, a high utd_ratio and buffer.mix); "
        "drq: SAC from pixels (a shared camera encoder, random-shift augmentation); "
        "bc: behaviour cloning of interventions (HG-DAgger; mlp or flow policies); "
        "qc: Q-chunking, online RL for flow chunk policies (best-of-N on a chunk critic); "
        "or an algorithm an installed package adds (entry-point group user_rl.algos)",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="a plugin algorithm's own settings: fields of "
        "its Settings that are not keys of algo (built-in algorithms take none)",
    )
    gamma: float = Field(0.99, gt=0.0, le=1.0)
    tau: float = Field(0.005, gt=0.0, le=1.0)
    actor_lr: float = Field(3e-4, gt=0.0)
    critic_lr: float = Field(3e-4, gt=0.0)
    batch_size: int = Field(256, ge=1)
    init_alpha: float = Field(0.1, gt=0.0)
    target_entropy_scale: float = 1.0
    learning_starts: int = Field(2000, ge=1)
    utd_ratio: float = Field(1.0, gt=0.0, description="learner updates per env step when paced")
    critic_layer_norm: bool = Field(False, description="sac, drq: LayerNorm in the critics' hidden layers (RLPD)")
    augment_pad: int = Field(4, ge=0, le=32, description="drq: images shift at random by up to this many pixels")
    policy_row_weight: float | None = Field(
        None,
        ge=0.0,
        description="bc, qc: weight of rows where the policy acted in what the policy imitates "
        "(interventions weigh 1); default bc 0 (HG-DAgger), qc 1 (Q-chunking's behaviour flow)",
    )

    ONLY_FOR: ClassVar[dict[str, tuple[str, ...]]] = {
        "critic_layer_norm": ("sac", "drq"),
        "augment_pad": ("drq",),
        "policy_row_weight": ("bc", "qc"),
    }

    @field_validator("type")
    @classmethod
    def _installed_algo(cls, value: str) -> str:
        return installed("algorithm", plugins.ALGOS, BUILTIN_ALGOS, value)

    @field_validator("options")
    @classmethod
    def _options_of_a_plugin(cls, options: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Keys of the plugin's Settings that algo itself lacks, each checked against its field's type."""
        name = info.data.get("type")
        if not options or name is None:  # nothing to check, or the type itself was refused
            return options
        return checked_plugin_options(name, options, set(cls.model_fields))

    @model_validator(mode="after")
    def _settings_of_the_chosen_algorithm(self) -> AlgoConfig:
        """A setting changed from its default for an algorithm the run does not use is a mistake
        (a plugin algorithm uses those its Settings has)."""
        for key, owners in settings_of_other_types(self):
            settings = plugin_algo_settings(self.type)
            if settings is not None and key in {f.name for f in dataclasses.fields(settings)}:
                continue
            raise ValueError(
                f"{key} is a setting of algo.type {' or '.join(owners)}; this run's algo.type is {self.type}"
            )
        return self


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
    strategy: Literal["uniform", "recency", "task_balanced"] = "uniform"
    recency_half_life: int = Field(50_000, ge=1)
    mix: dict[str, float] | None = Field(None, description="e.g. {online: 0.5, demo: 0.5} (RLPD)")
    n_step: int = Field(1, ge=1, le=64, description="rewards summed per transition; algo qc sets it to policy.chunk")
    action_horizon: int = Field(
        1,
        ge=1,
        le=128,
        description="future actions sampled per row (action_chunk, chunk_mask); set to policy.chunk by the run",
    )
    max_policy_lag: int | None = Field(
        None, ge=0, description="versions a row's policy may lag the newest on arrival to be used as is; None: no limit"
    )
    stale_data: Literal["downweight", "drop"] = Field(
        "downweight", description="rows past max_policy_lag: drawn stale_weight times as often, or never"
    )
    stale_weight: float = Field(0.25, gt=0, lt=1, description="how likely a stale row is drawn, against a fresh one")
    attach: list[AttachConfig] = Field(default_factory=list)
    scrub: bool = Field(True, description="verify sealed segments' checksums in the background after start-up")


class LearnerConfig(Section):
    publish_every_updates: int = Field(50, ge=1)
    torch_threads: int = Field(0, ge=0, description="0 picks what the fleet leaves free")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    weight_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="what the actor's floats travel as: half the bytes in bfloat16 or float16"
    )
    host: str = "127.0.0.1"
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


class EmbodimentConfig(Section):
    """One robot model of a heterogeneous fleet: its robots, trained by a policy of its own."""

    robot: RobotConfig
    num_robots: int = Field(1, ge=1, le=256)
    policy: PolicyConfig | None = Field(None, description="default: the run's policy section")
