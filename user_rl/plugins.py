"""Policies, algorithms and rewards that other installed packages add, by entry point.

A package declares them in its pyproject.toml, and a config names them like built-in ones:

    [project.entry-points."user_rl.policies"]
    residual_mlp = "my_package.policy:ResidualActor"     # policy.type: residual_mlp

Entry points, not registration at import time: the learner, its trainer process and every edge
run in processes of their own (Ray workers, subprocesses), and an installed package's entry
points are visible in each of them. Robot drivers come the same way (`user_rl.robots`,
hal/registry.py). Names are read without importing anything; a plugin is imported the first time
it is used, e.g. when a config naming it is validated against its class's `Settings`
(user_rl/config_plugins.py). A built-in keeps its name: a plugin of the same name is never loaded.

This module imports nothing of ours, so any part of user_rl may use it.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping
from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

POLICIES = "user_rl.policies"
ALGOS = "user_rl.algos"
REWARDS = "user_rl.rewards"

_loaded: dict[tuple[str, str, str], Any] = {}


@lru_cache(maxsize=8)
def _scan(path: tuple[str, ...]) -> dict[str, dict[str, EntryPoint]]:
    """Every user_rl group's entry points, read once per import path (a scan takes ~30 ms): a
    package installed while a process runs is seen by the processes started after it."""
    every = entry_points()
    return {group: {ep.name: ep for ep in every.select(group=group)} for group in (POLICIES, ALGOS, REWARDS)}


def _entry_points(group: str) -> dict[str, EntryPoint]:
    return _scan(tuple(sys.path))[group]


def plugin_names(group: str) -> list[str]:
    """Names the installed packages declare in `group`, sorted (nothing is imported)."""
    return sorted(_entry_points(group))


def known_names(group: str, builtins: Collection[str]) -> list[str]:
    """The built-in names in their own order, then the plugins' (for "known: ..." messages)."""
    return [*builtins, *(name for name in plugin_names(group) if name not in builtins)]


def builtin_or_plugin(
    group: str, builtins: Mapping[str, Any], name: str, what: str, error: type[Exception] = ValueError
) -> Any:
    """The built-in `name`, else what the plugin of `group` that declares it points at; an unknown
    name raises `error` naming the known ones (every registry looks its components up this way)."""
    found = builtins[name] if name in builtins else load_plugin(group, name)
    if found is None:
        raise error(f"unknown {what} {name!r}; known: {', '.join(known_names(group, builtins))}")
    return found


def load_plugin(group: str, name: str) -> Any | None:
    """What entry point `name` of `group` points at, imported on first use; None if no package declares it."""
    found = _entry_points(group).get(name)
    if found is None:
        return None
    key = (group, name, found.value)
    if key not in _loaded:
        _loaded[key] = found.load()
    return _loaded[key]
