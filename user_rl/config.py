"""Typed configuration: YAML plus `key=value` overrides, validated once, errors on one line.

cfg = load_config("configs/reach.yaml", ["fleet.num_robots=2", "algo.lr=1e-3"])
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

# Other modules import the sections (and the plugin names) from here, where the whole config lives.
from user_rl.config_plugins import BUILTIN_ALGOS, BUILTIN_POLICIES, BUILTIN_REWARDS  # noqa: F401
from user_rl.config_sections import (
    TELEOP_TOKEN,
    AlgoConfig,
    AttachConfig,
    BufferConfig,
    ConfigError,
    EdgeConfig,
    EmbodimentConfig,
    FleetConfig,
    InterventionConfig,
    LearnerConfig,
    PolicyConfig,
    RewardConfig,
    RobotConfig,
    SafetyConfig,
    Section,
    SecurityConfig,
    StopConfig,
    TeleopConfig,
    without_secrets,
)

EMBODIMENT_NAME = re.compile(r"[a-z0-9][a-z0-9_]*")


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
    reward: RewardConfig = Field(default_factory=RewardConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
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

    @model_validator(mode="after")
    def _policy_suits_the_algorithm(self) -> Config:
        """Chunk policies train with bc or qc, which see chunks through the buffer's sampler."""
        policy, algo = self.policy.type, self.algo.type
        algos = ("bc",) if policy == "lerobot" else ("bc", "qc")  # qc needs a flow policy's chunk critic
        if self.policy.chunked and algo not in algos:
            raise ValueError(f"policy.type {policy} trains with algo.type {' or '.join(algos)}, not {algo}")
        if algo == "qc" and (not self.policy.chunked or self.policy.best_of < 2):
            raise ValueError(
                "algo.type qc picks the best of several sampled chunks: it needs policy.type flow "
                "or vla with policy.best_of of 2 or more"
            )
        for key, wanted in (
            ("action_horizon", self.policy.chunk),
            ("n_step", self.policy.chunk if algo == "qc" else None),
        ):
            if wanted is None:
                continue
            if key in self.buffer.model_fields_set and getattr(self.buffer, key) not in (1, wanted):
                raise ValueError(f"buffer.{key}: this run's policy.chunk is {wanted}; leave buffer.{key} out")
            setattr(self.buffer, key, wanted)
        return self

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
        total = sum(e.num_robots for e in self.embodiments.values())
        if "num_robots" in self.fleet.model_fields_set and self.fleet.num_robots != total:
            raise ValueError(
                f"fleet.num_robots: the embodiments have {total} robots, not {self.fleet.num_robots}; "
                "leave fleet.num_robots out and set embodiments.<name>.num_robots"
            )
        if self.learner.data_port or self.learner.weights_port:
            raise ValueError(
                "learner.data_port: each embodiment has a learner of its own, so fixed ports would "
                "clash; leave learner.data_port and learner.weights_port at 0"
            )
        self.fleet.num_robots = total
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
