"""The arm controller's wire protocol, from the driver's side.

The controller listens on TCP and answers one line per request line (ASCII, space-separated;
angles in rad). Many arm controllers speak something like this; a serial arm would put the same
lines on /dev/ttyUSB0 instead of a socket::

    > HELLO arm-0        < OK example-arm-fw-1.2 joints=2 rate_hz=50
    > READ               < OK 0.10 -0.30          the joint positions
    > MOVE 0.05 -0.10    < OK 0.15 -0.40          joint steps, applied at the next control tick
    > GOTO 0.20 0.70     < OK 0.20 0.70           drive to a pose (an episode's start)
    > HOLD               < OK 0.15 -0.40          servo on the pose it has now
    > STATUS             < OK fault=none temp_c=38.0 holds=3
    any request          < ERR <why>

A request that is not answered within `timeout_s` raises TimeoutError: a driver must never wait
for ever on hardware that may be gone.
"""

from __future__ import annotations

import socket
import threading


class ControllerError(RuntimeError):
    """The controller answered ERR."""


class ArmClient:
    """One connection to the controller, for the arm named `arm`. Calls from several threads
    (the control loop, the edge's watchdog calling hold) are serialised here."""

    def __init__(self, address: str, arm: str, timeout_s: float = 5.0) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"controller address must look like HOST:PORT, got {address!r}")
        self.address = address
        self._lock = threading.Lock()
        self._sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self._file = self._sock.makefile("rb")
        hello = self.call("HELLO", arm)
        fields = dict(word.split("=", 1) for word in hello[1:])
        self.firmware = hello[0]
        self.joints = int(fields["joints"])
        self.rate_hz = float(fields["rate_hz"])

    def call(self, *words: object) -> list[str]:
        """Send one request, return the words of its OK answer."""
        line = " ".join(str(w) for w in words)
        with self._lock:
            self._sock.sendall(line.encode() + b"\n")
            answer = self._file.readline()  # raises TimeoutError after timeout_s
        if not answer:
            raise ConnectionError(f"the controller at {self.address} closed the connection")
        status, *rest = answer.decode().split()
        if status != "OK":
            raise ControllerError(f"{words[0]}: {' '.join(rest)}")
        return rest

    def read(self) -> list[float]:
        return [float(x) for x in self.call("READ")]

    def move(self, steps: list[float]) -> list[float]:
        return [float(x) for x in self.call("MOVE", *(f"{s:.6f}" for s in steps))]

    def goto(self, pose: list[float]) -> list[float]:
        return [float(x) for x in self.call("GOTO", *(f"{p:.6f}" for p in pose))]

    def hold(self) -> list[float]:
        return [float(x) for x in self.call("HOLD")]

    def status(self) -> dict[str, str]:
        return dict(word.split("=", 1) for word in self.call("STATUS"))

    def close(self) -> None:
        self._file.close()
        self._sock.close()
