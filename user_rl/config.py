"""Typed configuration: YAML plus `key=value` overrides, validated once, errors on one line.

cfg = load_config("configs/reach.yaml", ["fleet.num_robots=2", "algo.actor_lr=1e-3"])

`policy`, `algo` and `reward` are each a `type` plus that type's own settings class
(user_rl/config_plugins.py); a loaded config is never changed, and what follows from several
sections (the buffer's chunk length, a run's robots) is computed where it is read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    Field,
    SerializeAsAny,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)

# Other modules import the sections from here, where the whole config lives.
from user_rl.config_plugins import (
    AlgoSettings,
    ComponentSettings,
    PolicySettings,
    RewardSettings,
    default_settings,
    one_of,
    registered_settings,
    validated_settings,
)
from user_rl.config_sections import (
    TELEOP_TOKEN,
    AttachConfig,
    BufferConfig,
    ConfigError,
    EdgeConfig,
    FleetConfig,
    InterventionConfig,
    LearnerConfig,
    RobotConfig,
    SafetyConfig,
    Section,
    SecurityConfig,
    StopConfig,
    TeleopConfig,
    without_secrets,
)


def _section(name: str) -> WrapValidator:
    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return validated_settings(name, value, handler)

    return WrapValidator(validate)


# A section validated against the settings class its `type` names, dumped with that class's keys.
Policy = Annotated[SerializeAsAny[PolicySettings], _section("policy")]
Algo = Annotated[SerializeAsAny[AlgoSettings], _section("algo")]
Reward = Annotated[SerializeAsAny[RewardSettings], _section("reward")]


EMBODIMENT_NAME = re.compile(r"[a-z0-9][a-z0-9_]*")


class EmbodimentConfig(Section):
    """One robot model of a heterogeneous fleet: its robots, trained by a policy of its own."""

    robot: RobotConfig
    num_robots: int = Field(1, ge=1, le=256)
    policy: Policy | None = Field(None, description="default: the run's policy section")


class Config(Section):
    name: str = "run"
    seed: int = 0
    run_root: str = "runs"
    resume: str | None = Field(None, description="run directory to continue (checkpoint and buffer)")
    robot: RobotConfig = Field(default_factory=RobotConfig)
    fleet: FleetConfig = Field(default_factory=FleetConfig)
    edge: EdgeConfig = Field(default_factory=EdgeConfig)
    intervention: InterventionConfig = Field(default_factory=InterventionConfig)
    teleop: TeleopConfig = Field(default_factory=TeleopConfig)
    reward: Reward = Field(default_factory=lambda: default_settings("reward"))
    policy: Policy = Field(default_factory=lambda: default_settings("policy"))
    algo: Algo = Field(default_factory=lambda: default_settings("algo"))
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    stop: StopConfig = Field(default_factory=StopConfig)
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    safety: SafetyConfig = Field(default_factory=SafetyConfig)
    embodiments: dict[str, EmbodimentConfig] = Field(
        default_factory=dict, description="robot models with different spaces in one run, each with its own policy"
    )

    def public_dump(self) -> dict[str, Any]:
        """The config as plain data without its secrets: for files others can read (config.yaml,
        checkpoints). The processes that need a secret get `model_dump()`."""
        return without_secrets(self.model_dump())

    @model_validator(mode="before")
    @classmethod
    def _fleet_counts_the_embodiments(cls, data: Any) -> Any:
        """With embodiments, fleet.num_robots is their robots together (computed from the input)."""
        if not isinstance(data, dict) or not isinstance(data.get("embodiments"), dict) or not data["embodiments"]:
            return data
        fleet = data.get("fleet") or {}
        if isinstance(fleet, FleetConfig):
            fleet = fleet.model_dump(exclude_unset=True)
        try:
            total = sum(
                int(e.get("num_robots", 1) if isinstance(e, dict) else e.num_robots)
                for e in data["embodiments"].values()
            )
            given = int(fleet["num_robots"]) if "num_robots" in fleet else total
        except (AttributeError, TypeError, ValueError):
            return data  # the sections' own checks say what is wrong
        if given != total:
            raise ValueError(
                f"fleet.num_robots: the embodiments have {total} robots, not {given}; "
                "leave fleet.num_robots out and set embodiments.<name>.num_robots"
            )
        return {**data, "fleet": {**fleet, "num_robots": total}}

    @model_validator(mode="after")
    def _policy_suits_the_algorithm(self) -> Config:
        """Each algorithm declares the policies it trains (step or chunk policies, a choice among chunks)."""
        policy, algo = self.policy, self.algo
        if not algo.suits(type(policy)):
            algos = [name for name, cls in registered_settings("algo").items() if cls.suits(type(policy))]
            raise ValueError(f"policy.type {policy.type} trains with algo.type {one_of(algos)}, not {algo.type}")
        if algo.picks_among_chunks and policy.chunks_sampled < 2:
            choosers = [name for name, cls in registered_settings("policy").items() if cls.samples_chunks]
            raise ValueError(
                f"algo.type {algo.type} picks the best of several sampled chunks: it needs policy.type "
                f"{one_of(choosers)} with policy.best_of of 2 or more"
            )
        for key, wanted in (("action_horizon", self.action_horizon), ("n_step", self.n_step)):
            if key in self.buffer.model_fields_set and getattr(self.buffer, key) not in (1, wanted):
                raise ValueError(f"buffer.{key}: this run's policy.chunk is {wanted}; leave buffer.{key} out")
        for key in ("idle_rows", "idle_weight"):  # a saved config holds the buffer's default: that is no choice
            given, default = getattr(self.buffer, key), BufferConfig.model_fields[key].default
            if key in self.buffer.model_fields_set and given not in (default, getattr(self.teleop, key)):
                raise ValueError(f"buffer.{key}: a run takes it from teleop.{key}; set that instead")
        return self

    @property
    def action_horizon(self) -> int:
        """Future actions the buffer samples per row: the policy's chunk."""
        return self.policy.actions_per_chunk

    @property
    def n_step(self) -> int:
        """Rewards summed per transition: the chunk for an algorithm that sums over chunks, else buffer.n_step."""
        return self.policy.actions_per_chunk if self.algo.returns_over_chunks else self.buffer.n_step

    def run_buffer(self) -> BufferConfig:
        """The buffer section with what the policy and algorithm decide (n_step, action_horizon), and
        what the teleop section says of idle rows, filled in."""
        return self.buffer.model_copy(
            update={
                "n_step": self.n_step,
                "action_horizon": self.action_horizon,
                "idle_rows": self.teleop.idle_rows,
                "idle_weight": self.teleop.idle_weight,
            }
        )

    @model_validator(mode="after")
    def _offline_runs_have_data_and_an_end(self) -> Config:
        """No robots: the learner trains on attached buffers alone, with nothing to evaluate on."""
        if self.fleet.num_robots or self.embodiments:
            return self
        offline = "fleet.num_robots: 0 is an offline run (the learner alone, on attached buffers)"
        if not self.buffer.attach and not self.resume:
            raise ValueError(
                f"{offline}: name what it trains on in buffer.attach (user-rl buffer import makes a buffer "
                "of a LeRobot dataset)"
            )
        if self.stop.max_updates is None:
            raise ValueError(f"{offline}: no env steps end it; set stop.max_updates")
        if self.stop.success_rate is not None or self.stop.mean_return is not None:
            raise ValueError(f"{offline}: it has no robot to check a goal on; leave stop.success_rate out")
        return self

    @property
    def offline(self) -> bool:
        """A run without robots: the learner trains on attached buffers until stop.max_updates."""
        return self.fleet.num_robots == 0

    @model_validator(mode="after")
    def _watchdog_outlasts_a_control_period(self) -> Config:
        hz, deadline = self.fleet.control_hz, self.safety.deadline_s
        if hz > 0 and 0 < deadline <= 1.0 / hz:
            raise ValueError(
                f"safety.deadline_s: {deadline:g} s is not longer than one control period at "
                f"fleet.control_hz={hz:g}; the watchdog would hold every step"
            )
        return self

    @model_validator(mode="after")
    def _embodiments_own_their_robots(self) -> Config:
        if not self.embodiments:
            return self
        for name in self.embodiments:
            if not EMBODIMENT_NAME.fullmatch(name):
                raise ValueError(
                    f"embodiments: name {name!r} must be lower-case letters, digits and _ "
                    "(it names a directory and the robots' ids)"
                )
        if self.robot != RobotConfig():
            raise ValueError(
                "robot: a run with embodiments takes each robot from its embodiment; "
                "move this section to embodiments.<name>.robot"
            )
        if self.learner.data_port or self.learner.weights_port:
            raise ValueError(
                "learner.data_port: each embodiment has a learner of its own, so fixed ports would "
                "clash; leave learner.data_port and learner.weights_port at 0"
            )
        return self

    def robot_options(self, index: int) -> dict[str, Any]:
        """Options for the index-th robot of the fleet: unique id and seed."""
        prefix = self.fleet.robot_id_prefix or self.robot.type
        return {**self.robot.options, "robot_id": f"{prefix}-{index}", "seed": self.seed + 1000 * index}

    def embodiment_configs(self) -> dict[str, Config]:
        """Each embodiment as the config of a one-model fleet, in config order. A plain run is its
        own only embodiment, named "". Robot ids are `<embodiment>-<index>` and seeds stay unique."""
        if not self.embodiments:
            return {"": self}
        configs, robots_before = {}, 0
        for name, embodiment in self.embodiments.items():
            data = self.model_dump(exclude={"embodiments", "robot"})
            data["name"] = f"{self.name}-{name}"
            data["seed"] = self.seed + 1000 * robots_before
            data["robot"] = embodiment.robot.model_dump()
            data["resume"] = str(Path(self.resume) / name) if self.resume else None
            data["fleet"].update(num_robots=embodiment.num_robots, robot_id_prefix=name)
            if embodiment.policy is not None:
                data["policy"] = embodiment.policy.model_dump()
            configs[name] = Config.model_validate(data)
            robots_before += embodiment.num_robots
        return configs

    def embodiment(self, name: str | None) -> Config:
        """The one-model config a single edge or attach uses; `name` is required with embodiments."""
        configs = self.embodiment_configs()
        if name is None and not self.embodiments:
            return self
        if name not in configs or not name:
            choices = ", ".join(n for n in configs if n) or "none (this config has one robot model)"
            raise ConfigError(
                f"config error: embodiment {name!r}: say which with --embodiment; this config has: {choices}"
            )
        return configs[name]


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config error: {key}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _explain(exc: ValidationError) -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        section: Any = Config
        for part in err["loc"][:-1]:
            section = section.model_fields[str(part)].annotation
        allowed = ", ".join(section.model_fields)
        return f"config error: unknown key {key!r}; allowed here: {allowed}"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    got_text = "" if isinstance(got, dict) else f" (got {got!r})"
    where = f"{key}: " if key else ""  # a check across sections names its key in the message
    if err["type"] == "settings_key":  # "policy.chunk is a setting of ..."
        where = f"{key} "
    return f"config error: {where}{msg}{got_text}"


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"config error: override {item!r} is not key=value")
        _set_dotted(tree, key.strip(), yaml.safe_load(text) if text else "")
    return tree


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def build_config(data: dict[str, Any], overrides: list[str] | None = None) -> Config:
    """Validate a config tree (plus overrides); raise `ConfigError` with a one-line message."""
    merged = _merge(data, parse_overrides(overrides or []))
    try:
        return Config.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_explain(exc)) from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config error: no config file at {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config error: {path} is not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config error: {path} must hold a mapping at the top level")
    return build_config(data, overrides)


def dump_config(cfg: Config) -> str:
    """The config as YAML, without its secrets (config.yaml in a run directory is readable by others)."""
    return yaml.safe_dump(cfg.public_dump(), sort_keys=False)
