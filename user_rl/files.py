"""Small files that must survive a crash or a power cut: counters, leases, latches."""

from __future__ import annotations

import os
from pathlib import Path


def replace_durably(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically (a reader sees the old or the new file, never half of
    one) and durably: the data and the rename are both fsynced before this returns."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself must survive a power cut
    finally:
        os.close(directory)
