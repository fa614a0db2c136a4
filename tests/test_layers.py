"""The packages of user_rl form layers, and a module imports only from its own package or from a
layer below its own: never upwards, not even lazily inside a function or for type checking (a lazy
upward import is how device adapters once sat in a package above the HAL that used them). The
layers are listed in docs/architecture.md; a new package gets a layer here and there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "user_rl"
DOCS = PACKAGE.parent / "docs" / "architecture.md"

# Bottom first. A top-level module or package is one unit; the three config modules are one (settings).
LAYERS: list[set[str]] = [
    {"files", "token_bucket", "plugins", "progress", "plots", "extras", "tensorboard_log"},  # utilities
    {"hal"},  # the robot contract, the driver registry, LeRobot's robots
    {"sim", "wire", "config"},  # simulated drivers; messages, columns and spaces; settings
    {"robots", "security", "policies"},  # safety filter; keys; models
    {"algos"},
    {"cloud"},  # ingest, buffer, learner
    {"rewards"},  # rewards from people (the classifier reads frames from the buffer)
    {"edge"},  # the control loop and what may act instead of the policy
    {"datasets", "evaluation", "services", "status", "nodes", "testing"},
    {"launch", "recording"},  # places processes; drives a robot for people (record, replay)
    {"cli"},
]
SETTINGS = {"config", "config_sections", "config_plugins"}


def unit(module: str) -> str:
    """The layered unit of a dotted module name inside user_rl."""
    name = module.split(".")[1]
    return "config" if name in SETTINGS else name


def layer(name: str) -> int:
    return next(i for i, units in enumerate(LAYERS) if name in units)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every user_rl import in a file, wherever it is written."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, name) for line, name in found if name.startswith("user_rl.")]


def modules() -> list[tuple[Path, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found.append((path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)))
    return [(path, name) for path, name in found if name != "user_rl"]


def test_every_package_has_a_layer() -> None:
    units = {unit(name) for _, name in modules()}
    placed = set().union(*LAYERS)
    assert units <= placed, f"give these a layer in tests/test_layers.py and docs/architecture.md: {units - placed}"
    assert all(len([i for i, u in enumerate(LAYERS) if name in u]) == 1 for name in placed)


def test_the_docs_list_the_same_layers() -> None:
    section = DOCS.read_text().split("Layers, bottom first", 1)[1]
    numbered = re.search(r"^1\. .*?(?=\n\n)", section, re.M | re.S).group(0).splitlines()
    assert [set(re.findall(r"`(\w+)`", line)) - (SETTINGS - {"config"}) for line in numbered] == LAYERS


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = []
    for path, name in modules():
        own = unit(name)
        for line, imported in imported_modules(path):
            other = unit(imported)
            if other != own and layer(other) >= layer(own):
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({own}) imports {imported} ({other})")
    assert not upward, "imports that go up (or sideways) a layer:\n" + "\n".join(upward)


def test_the_checker_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from user_rl.cli import main\n"
        "def f():\n    import user_rl.edge.daemon\n"
    )
    assert imported_modules(source) == [(3, "user_rl.cli"), (5, "user_rl.edge.daemon")]
