"""Background threads that never die silently: whatever stops one is logged with its
traceback and kept, so the learner's status (and the progress line) can name it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class GuardedThread(threading.Thread):
    def __init__(self, name: str, target: Callable[[], None]) -> None:
        super().__init__(name=name, daemon=True)
        self._work = target
        self.error: str | None = None  # set once, when the thread stopped on an exception

    def run(self) -> None:
        try:
            self._work()
        except BaseException as exc:  # everything: a thread that stops must say why
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("learner thread %r stopped on an error", self.name)
