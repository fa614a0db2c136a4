"""Config names that installed packages may add (policies, algorithms, rewards; user_rl/plugins.py):
checked against the built-ins and the entry points, and a plugin algorithm's own `algo.options`.
Imports no torch, so the config stays loadable on any machine."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import TypeAdapter, ValidationError

from user_rl import plugins

# The built-in types (a test keeps each equal to its registry; the config stays importable without
# torch). Installed packages add more through entry points (user_rl/plugins.py).
BUILTIN_POLICIES = ("mlp", "flow", "vla", "lerobot")
BUILTIN_ALGOS = ("sac", "drq", "bc", "qc")
BUILTIN_REWARDS = ("env", "labels", "classifier")


def installed(kind: str, group: str, builtins: tuple[str, ...], name: str) -> str:
    """`name` if it is a built-in or an installed package's entry point in `group`, else a ValueError listing them."""
    names = plugins.known_names(group, builtins)
    if name not in names:
        raise ValueError(
            f"unknown {kind}; known: {', '.join(names)}; an installed package adds more through "
            f"the entry-point group {group!r}"
        )
    return name


def plugin_algo_settings(name: str) -> type | None:
    """The Settings dataclass of a plugin algorithm (its package is imported); None for a built-in."""
    if name in BUILTIN_ALGOS:
        return None
    try:
        return plugins.load_plugin(plugins.ALGOS, name).Settings
    except Exception as exc:  # a broken plugin is a mistake in the environment, reported like a config one
        raise ValueError(f"algo.type {name}: its package failed to load: {type(exc).__name__}: {exc}") from None


def checked_plugin_options(name: str, options: dict[str, Any], algo_keys: set[str]) -> dict[str, Any]:
    """`algo.options` of plugin algorithm `name`: keys of its Settings that algo itself lacks
    (`algo_keys`), each checked against its field's type; a ValueError names the first wrong one."""
    settings = plugin_algo_settings(name)
    own = [f.name for f in dataclasses.fields(settings) if f.name not in algo_keys] if settings else []
    unknown = sorted(set(options) - set(own))
    if unknown:
        raise ValueError(
            f"unknown key {unknown[0]!r} for algo.type {name}; allowed: "
            f"{', '.join(own) or 'none (its settings are keys of algo itself)'}"
        )
    try:
        checked = TypeAdapter(settings).validate_python(options)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")  # the Settings' own check (__post_init__) says it all
        raise ValueError(f"{where}: {message} (got {err['input']!r})" if where else message) from None
    return {key: getattr(checked, key) for key in options}
