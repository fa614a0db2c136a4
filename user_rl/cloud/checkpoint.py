"""Checkpoints: the learner's full state, and everything `user-rl eval` needs to rebuild the actor
(its spaces as text: `wire/spaces.py`'s `spaces_to_text`).

Written to a temporary file and renamed into place, so a crash never leaves half a checkpoint.
During training they are snapshotted in memory and written by a background thread.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return torch.load(path, map_location="cpu", weights_only=True)


def snapshot(obj: Any) -> Any:
    """A deep copy of nested state (tensors cloned to CPU), cheap enough to take between updates."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(snapshot(v) for v in obj)
    return copy.deepcopy(obj)


class BackgroundCheckpointer:
    """Writes snapshots in a thread, so the learner never pauses for the disk.

    Each write atomically replaces the previous checkpoint. If a write is still running when
    the next snapshot arrives, the newer one waits and the one in between is skipped.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._next: dict[str, Any] | None = None
        self._cond = threading.Condition()
        self._closed = False
        self.written = 0
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    def submit(self, payload: dict[str, Any]) -> None:
        with self._cond:
            self._next = payload
            self._cond.notify()

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # not a failed write (those are caught below): the thread itself broke
            self.last_error = f"the checkpoint writer died: {type(exc).__name__}: {exc}"
            log.exception("the checkpoint writer thread died; no more background checkpoints")

    def _serve(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._closed:
                    self._cond.wait()
                payload, self._next = self._next, None
                if payload is None:
                    return
            try:
                save_checkpoint(self.path, payload)
                self.written += 1
                self.last_error = None
            except Exception as exc:  # a full disk (or anything else) must not stop training: reported in status
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("checkpoint write to %s failed (training goes on)", self.path)

    @property
    def error(self) -> str | None:
        """Why the last write failed (cleared by the next good one), or that the writer thread died."""
        if not self._thread.is_alive() and not self._closed:
            return self.last_error or "the checkpoint writer thread died"
        return self.last_error

    def close(self) -> None:
        """Finish the pending write, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=120)
