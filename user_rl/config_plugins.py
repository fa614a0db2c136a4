"""The config sections that name a registered component (`policy:`, `algo:`, `reward:`): `type` plus
that type's own settings class, which the component declares next to its code as its `Settings`
attribute (built-ins and entry-point plugins alike, user_rl/plugins.py). A section is validated
against the class its `type` names, so each type's keys, defaults and checks live with the type.

The registries (which import torch) are imported the first time a section is validated, not when
this module is: commands that never read a policy stay light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from user_rl import plugins
from user_rl.config_sections import Section


class ComponentSettings(Section):
    """A registered component's settings: its `type` and the keys of that type."""

    type: str

    def summary(self) -> dict[str, Any]:
        """The type and the settings changed from their defaults (for messages)."""
        return {"type": self.type, **self.model_dump(exclude_defaults=True, exclude={"type"})}

    def options(self) -> dict[str, Any]:
        """Every setting but `type`: the keyword arguments the component is built with."""
        return self.model_dump(exclude={"type"})


class PolicySettings(ComponentSettings):
    """What every policy has; a policy's `Settings` adds the keyword arguments its actor takes."""

    chunked: ClassVar[bool] = False  # acts in chunks of actions (trained by algorithms that see chunks)
    samples_chunks: ClassVar[bool] = False  # can sample several chunks per inference (`chunks_sampled`)
    steerable_by_noise: ClassVar[bool] = False  # its chunk is a deterministic function of a noise input (dsrl)

    type: str = "mlp"
    freeze: list[str] = Field(
        default_factory=list,
        description="parameter-name prefixes kept fixed in training, e.g. [encoder]: a pretrained backbone",
    )
    weights: str | None = Field(None, description="initial actor weights: a .safetensors file or a run's checkpoint.pt")

    @field_validator("weights")
    @classmethod
    def _absolute_weights(cls, value: str | None) -> str | None:
        """The learner may run in another working directory (a Ray worker)."""
        return None if value is None else str(Path(value).expanduser().resolve())

    @property
    def actions_per_chunk(self) -> int:
        """Actions the policy outputs per inference (what the buffer samples per row)."""
        return 1

    @property
    def chunks_sampled(self) -> int:
        """Chunks sampled per inference for a chunk critic to pick from (1: no choice)."""
        return 1

    def options(self) -> dict[str, Any]:
        """The keyword arguments `make_actor(type, obs_space, action_space, **options)` takes."""
        options = self.model_dump(exclude={"type", "weights", "freeze"})
        return {**options, "freeze": list(self.freeze)} if self.freeze else options


class AlgoSettings(ComponentSettings):
    """What every algorithm has (the learner reads these); an algorithm's `Settings` adds its own."""

    trains_step_policies: ClassVar[bool] = True  # policies that act one action per step
    trains_chunk_policies: ClassVar[bool] = False  # chunk policies (`PolicySettings.chunked`)
    picks_among_chunks: ClassVar[bool] = False  # needs several sampled chunks per inference to pick from
    returns_over_chunks: ClassVar[bool] = False  # sums rewards over a chunk (buffer.n_step = the chunk)
    needs_cameras: ClassVar[bool] = False  # learns from camera images
    steers: ClassVar[bool] = False  # trains a small actor that steers the policy, whose weights stay as loaded

    type: str = "sac"
    gamma: float = Field(0.99, gt=0.0, le=1.0)
    batch_size: int = Field(256, ge=1)
    learning_starts: int = Field(
        2000,
        ge=1,
        description="rows the buffer holds before the first update, attached ones included; a paced "
        "fleet's updates are also budgeted from online env steps past it: utd_ratio x (env steps - "
        "learning_starts), updates of an offline start (fleet.num_robots 0) left out",
    )
    utd_ratio: float = Field(1.0, gt=0.0, description="learner updates per env step when paced")

    @classmethod
    def suits(cls, policy: type[PolicySettings]) -> bool:
        """Whether this algorithm trains policies of type `policy` (their settings may still need changing)."""
        if cls.picks_among_chunks and not policy.samples_chunks:
            return False
        return cls.trains_chunk_policies if policy.chunked else cls.trains_step_policies

    def acting_actor(self, policy_actor: Any, obs_space: Any, action_space: Any) -> Any:
        """What runs on the robot under this algorithm, given the policy's actor: the actor itself,
        or (an algorithm that `steers`) that actor wrapped with the small one it trains."""
        return policy_actor


class RewardSettings(ComponentSettings):
    """What every reward has; a reward's `Settings` adds the keyword arguments its class takes."""

    type: str = "env"


SECTIONS: dict[str, tuple[str, str, str, type[ComponentSettings]]] = {
    # section: (what it names, its registry's module, the registry's lookup, the base class)
    "policy": ("policy", "user_rl.policies", "policy_settings", PolicySettings),
    "algo": ("algorithm", "user_rl.algos", "algo_settings", AlgoSettings),
    "reward": ("reward", "user_rl.rewards", "reward_settings", RewardSettings),
}
GROUPS = {"policy": plugins.POLICIES, "algo": plugins.ALGOS, "reward": plugins.REWARDS}


def _registry(section: str) -> tuple[Callable[[], list[str]], Callable[[str], type[ComponentSettings]]]:
    _, module_name, lookup, _ = SECTIONS[section]
    module = importlib.import_module(module_name)
    return getattr(module, f"{section}_names"), getattr(module, lookup)


def settings_class(section: str, name: str) -> type[ComponentSettings]:
    """The settings class of the type `name` of `section`; a ValueError says why there is none."""
    kind, _, _, base = SECTIONS[section]
    names, lookup = _registry(section)
    known = names()
    if name not in known:
        raise ValueError(
            f"unknown {kind}; known: {', '.join(known)}; an installed package adds more through "
            f"the entry-point group {GROUPS[section]!r}"
        )
    try:
        found = lookup(name)
    except Exception as exc:  # a broken plugin is a mistake in the environment, reported like a config one
        raise ValueError(f"{section}.type {name}: its package failed to load: {type(exc).__name__}: {exc}") from None
    if not (isinstance(found, type) and issubclass(found, base)):
        raise ValueError(f"{section}.type {name}: its Settings must subclass user_rl.config.{base.__name__}")
    return found


def registered_settings(section: str) -> dict[str, type[ComponentSettings]]:
    """Each known type of `section` and its settings class (for messages; a plugin that fails to load is left out)."""
    names, _ = _registry(section)
    found = {}
    for name in names():
        try:
            found[name] = settings_class(section, name)
        except ValueError:
            continue
    return found


def one_of(names: list[str]) -> str:
    """Names as a message lists choices: "a", "a or b", "a, b or c"."""
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


def _unknown_key(section: str, chosen: str, key: str, allowed: list[str], value: Any) -> InitErrorDetails:
    """A key the chosen type lacks, with the types that have it (from the registry) or the allowed keys."""
    owners = [name for name, cls in registered_settings(section).items() if key in cls.model_fields]
    if owners:
        message = f"is a setting of {section}.type {one_of(owners)}; this {section}'s type is {chosen}"
    else:
        message = f"is not a key of {section}.type {chosen}; allowed: {', '.join(allowed)}"
    return {"type": PydanticCustomError("settings_key", message), "loc": (key,), "input": value}


def validated_settings(section: str, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A wrap validator's body: `value` (a section's mapping) validated against its type's settings class."""
    if isinstance(value, SECTIONS[section][3]):
        return value  # built (and validated) as its own settings class
    if not isinstance(value, dict):
        return handler(value)  # not a mapping: the base class says so
    if section == "algo" and isinstance(value.get("options"), dict):  # older configs nest a plugin's own keys
        nested = value["options"]
        value = {**{k: v for k, v in value.items() if k != "options"}, **nested}
    name = value.get("type", SECTIONS[section][3].model_fields["type"].default)
    if not isinstance(name, str):
        return handler(value)
    try:
        cls = settings_class(section, name)
    except ValueError as exc:
        error: InitErrorDetails = {
            "type": PydanticCustomError("settings_type", str(exc)),
            "loc": ("type",),
            "input": name,
        }
        raise ValidationError.from_exception_data(section, [error]) from None
    unknown = [key for key in value if key not in cls.model_fields]
    if unknown:
        errors = [_unknown_key(section, name, unknown[0], list(cls.model_fields), value[unknown[0]])]
        raise ValidationError.from_exception_data(section, errors)
    return cls.model_validate(value)


def default_settings(section: str) -> ComponentSettings:
    """The section's settings when the config leaves it out (its default type's)."""
    name = SECTIONS[section][3].model_fields["type"].default
    return settings_class(section, name).model_validate({"type": name})
