"""Installing an example package for tests: with pip, as its guide says, but into a directory of its
own that goes on PYTHONPATH, so this environment and the checkout stay as they were."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def pip_install_copy(package: Path, root: Path) -> Path:
    """Install `package` from a copy in `root`/src (pip builds in the source tree) into `root`/site
    with pip; return that directory. A failed install raises with pip's output."""
    src, site = root / "src", root / "site"
    shutil.copytree(package, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode:
        raise RuntimeError(f"pip could not install {package}:\n{done.stdout}{done.stderr}")
    return site
