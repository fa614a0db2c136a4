"""Waiting for a condition in tests and benchmarks that drive real processes and sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def wait_until(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    poll_s: float = 0.05,
    details: Callable[[], str] | None = None,
) -> None:
    """Poll `predicate` until it is true; fail with `what` in the message after `timeout` seconds,
    and what `details()` says then (e.g. the output of the process waited on)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}" + (f"\n{details()}" if details else "")
            )
        time.sleep(poll_s)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now (for a learner that must keep its address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_run_dir(output_lines: list[str], timeout: float) -> Path:
    """The run directory that `user-rl train` announces on its output (lines collected by a reader thread)."""
    prefix = "run directory: "
    wait_until(
        lambda: any(line.startswith(prefix) for line in output_lines),
        timeout,
        "the run to start",
        details=lambda: "".join(output_lines[-60:]),
    )
    return Path(next(line for line in output_lines if line.startswith(prefix))[len(prefix) :].strip())


@contextmanager
def serving(poll: Callable[[], object]) -> Iterator[list[BaseException]]:
    """Call `poll()` over and over on a daemon thread while the block runs (e.g. a live ingest).
    Yields the list that receives the exception if the loop ever dies, for the test to assert on."""
    stop, crashed = threading.Event(), []

    def loop() -> None:
        try:
            while not stop.is_set():
                poll()
        except BaseException as exc:  # the caller fails its test on this
            crashed.append(exc)

    thread = threading.Thread(target=loop, name="serving", daemon=True)
    thread.start()
    try:
        yield crashed
    finally:
        stop.set()
        thread.join(10)
