"""The tree keeps the style pyproject.toml configures: `ruff format` leaves it unchanged and `ruff check` finds nothing.

The dev extra pins ruff's version, so the formatter's output cannot drift between machines. To fix
a failure: `ruff format . && ruff check --fix .` and read what is left.
"""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_the_tree_is_formatted_and_lint_clean(command: list[str]) -> None:
    run = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, f"ruff {' '.join(command)} .:\n{run.stdout}{run.stderr}"
