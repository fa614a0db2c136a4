"""Waiting for a condition in tests and benchmarks that drive real processes and sockets."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(predicate: Callable[[], object], timeout: float, what: str, poll_s: float = 0.05) -> None:
    """Poll `predicate` until it is true; fail with `what` in the message after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(poll_s)
