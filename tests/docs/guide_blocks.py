"""What a guide in docs/guides/ shows, read back for the tests that keep it true.

A code block that a guide presents as a whole file follows a marker line naming the file
(relative to the repository root); one that quotes part of a file is marked `excerpt`:

    <!-- file: examples/user_rl_point_plugin/point.yaml -->
    ```yaml
    ...the whole file, exactly...
    ```

    <!-- excerpt: examples/user_rl_point_plugin/pyproject.toml -->
    ```toml
    ...lines that appear in the file as they are...
    ```

Commands are the lines of ```bash blocks: comments and blank lines left out, a line ending in `\\`
joined with the next. A block with no language right after a bash block (nothing but blank lines
between) shows what the bash block's last command prints. Fences start at the beginning of a line
(not inside list items).

    assert not drift(guide)                 # every file and excerpt block matches its file
    for command in commands(guide):
        shown = outputs(guide).get(command)  # what the guide says it prints, if it says
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_MARKED = re.compile(r"^<!-- (file|excerpt): (\S+) -->\n```[^\n]*\n(.*?)^```", re.S | re.M)
_BASH = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.S | re.M)
_OUTPUT = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```\n\s*^```\n(.*?)^```", re.S | re.M)


def _marked(guide: Path, kind: str) -> list[tuple[str, str]]:
    return [(path, text) for found, path, text in _MARKED.findall(Path(guide).read_text()) if found == kind]


def file_blocks(guide: Path) -> dict[str, str]:
    """{path: the block's text} for each block the guide presents as a whole file."""
    blocks: dict[str, str] = {}
    for path, text in _marked(guide, "file"):
        if path in blocks:
            raise ValueError(f"{guide}: {path} is shown as a whole file twice")
        blocks[path] = text
    return blocks


def excerpt_blocks(guide: Path) -> list[tuple[str, str]]:
    """(path, the block's text) for each block that quotes part of a file."""
    return _marked(guide, "excerpt")


def drift(guide: Path) -> list[str]:
    """What differs between the guide's file and excerpt blocks and the files (empty: nothing)."""
    problems = []
    for path, text in file_blocks(guide).items():
        file = REPO / path
        if not file.is_file():
            problems.append(f"{path}: no such file")
        elif file.read_text() != text:
            shown, real = text.splitlines(), file.read_text().splitlines()
            line = next((i for i, (a, b) in enumerate(zip(shown, real)) if a != b), min(len(shown), len(real)))
            problems.append(f"{path}: the guide's block differs from the file from line {line + 1} on")
    for path, text in excerpt_blocks(guide):
        file = REPO / path
        if not file.is_file():
            problems.append(f"{path}: no such file")
        elif text not in file.read_text():
            problems.append(f"{path}: the guide quotes lines that are not in the file: {text.splitlines()[0]!r}...")
    return problems


def commands(guide: Path) -> list[str]:
    """The shell commands of the guide's bash blocks, in order."""
    return [command for block in _BASH.findall(Path(guide).read_text()) for command in _lines(block)]


def outputs(guide: Path) -> dict[str, str]:
    """{command: the text the guide shows it printing} for bash blocks followed by an output block."""
    return {_lines(block)[-1]: shown for block, shown in _OUTPUT.findall(Path(guide).read_text())}


def _lines(block: str) -> list[str]:
    """A bash block's commands: comments and blank lines left out, `\\` continuations joined."""
    found: list[str] = []
    pending = ""
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        found.append((pending + line.strip()).strip())
        pending = ""
    return found
