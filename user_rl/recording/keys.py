"""Keys on the terminal that runs `user-rl record`: LeRobot's keyboard events without a display.

LeRobot listens to the arrow keys through pynput, which needs a display; a robot's controller often
has none (ssh, a container). So a key is a line on stdin (the key, then Enter), and each becomes the
request a teleoperator's event or the teleop page makes (`OperatorRequests`), taken by the loop
between two steps:

    s   success: the episode ends here, labelled a success (kept)
    f   failure: the episode ends here, labelled a failure (kept)
    r   re-record: the episode (or, in the reset time, the one just recorded) is discarded and recorded again
    q   stop: the episode ends here (kept) and recording stops
    Enter alone: the episode (or the reset time) ends now, without a label (LeRobot's right arrow)

A closed stdin (a pipe at its end, /dev/null) gives no keys; nothing else changes.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TextIO

from user_rl.edge.operator import OperatorRequests

HELP = "keys (then Enter): s success, f failure, r re-record, q stop; Enter alone ends the episode (or the reset) now"
BY = "keyboard"


class TerminalKeys:
    """Reads key lines from `stream` on a daemon thread and turns them into requests."""

    def __init__(
        self,
        requests: OperatorRequests,
        stop: Callable[[], None],
        say: Callable[[str], None],
        stream: TextIO | None = None,
    ) -> None:
        self.requests, self.stop, self.say = requests, stop, say
        self.stream = stream if stream is not None else sys.stdin
        self.pressed = 0
        self._thread = threading.Thread(target=self._read, name="record-keys", daemon=True)

    def start(self) -> TerminalKeys:
        if self.stream is not None and not self.stream.closed:
            self._thread.start()
        return self

    def press(self, line: str) -> None:
        """One line read from the terminal."""
        key = line.strip().lower()[:1]
        self.pressed += 1
        if key == "s":
            self.requests.mark(True, by=BY)
        elif key == "f":
            self.requests.mark(False, by=BY)
        elif key == "r":
            self.requests.discard()
        elif key == "q":
            self.stop()
        elif key == "":
            self.requests.reset(by=BY)
        else:
            self.pressed -= 1
            self.say(f"unknown key {line.strip()!r}; {HELP}")

    def _read(self) -> None:
        try:
            for line in self.stream:
                self.press(line)
        except (OSError, ValueError):  # stdin closed under us: no more keys
            return
