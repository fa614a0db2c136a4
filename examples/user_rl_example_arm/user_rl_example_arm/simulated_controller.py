"""A simulated arm controller that speaks the protocol in `client.py`, so the driver can be tried
and tested without the arm. Your own package would talk to your real controller instead.

    python -m user_rl_example_arm.simulated_controller --listen 127.0.0.1:7700 --rate-hz 50

It serves any number of two-joint arms, one per name a client says HELLO with (a connection
that says the same name drives the same arm). Each MOVE is answered at the arm's next control
tick, as a servo loop would. `--hang ARM:N` makes it stop answering ARM after N moves on one
connection (a pulled cable), to test what the fleet does with a robot that goes silent.
Standard library only: it starts in a blink.
"""

from __future__ import annotations

import argparse
import socketserver
import sys
import threading
import time
from dataclasses import dataclass, field

JOINTS = 2
LIMIT_RAD = 3.0
MAX_STEP_RAD = 0.1
FIRMWARE = "example-arm-fw-1.2"


@dataclass
class Arm:
    period_s: float
    joints: list[float] = field(default_factory=lambda: [0.0] * JOINTS)
    next_tick: float = field(default_factory=time.monotonic)
    holds: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for_tick(self) -> None:
        """Sleep until the next tick of the arm's clock (late ticks are not made up for)."""
        with self.lock:
            self.next_tick = max(self.next_tick + self.period_s, time.monotonic() - self.period_s)
            wake = self.next_tick
        time.sleep(max(0.0, wake - time.monotonic()))

    def move(self, steps: list[float]) -> list[float]:
        with self.lock:
            self.joints = [_clamp(q + _clamp(s, MAX_STEP_RAD), LIMIT_RAD) for q, s in zip(self.joints, steps)]
            return list(self.joints)

    def goto(self, pose: list[float]) -> list[float]:
        with self.lock:
            self.joints = [_clamp(p, LIMIT_RAD) for p in pose]
            return list(self.joints)

    def hold(self) -> list[float]:
        with self.lock:
            self.holds += 1
            return list(self.joints)


def _clamp(x: float, limit: float) -> float:
    return max(-limit, min(limit, x))


class Controller(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, listen: tuple[str, int], rate_hz: float, hang: dict[str, int]) -> None:
        super().__init__(listen, Connection)
        self.rate_hz, self.hang = rate_hz, hang
        self.arms: dict[str, Arm] = {}
        self.arms_lock = threading.Lock()

    def arm(self, name: str) -> Arm:
        with self.arms_lock:
            return self.arms.setdefault(name, Arm(period_s=1.0 / self.rate_hz))


class Connection(socketserver.StreamRequestHandler):
    server: Controller

    def handle(self) -> None:
        arm, name, moves = None, "", 0
        for raw in self.rfile:
            words = raw.decode(errors="replace").split()
            if not words:
                continue
            command, args = words[0].upper(), words[1:]
            if name in self.server.hang and moves >= self.server.hang[name]:
                continue  # the cable is pulled: requests go unanswered until the client gives up
            try:
                if command == "HELLO":
                    name = args[0]
                    arm = self.server.arm(name)
                    answer = f"{FIRMWARE} joints={JOINTS} rate_hz={self.server.rate_hz:g}"
                elif arm is None:
                    raise ValueError("say HELLO <arm> first")
                elif command == "READ":
                    answer = _numbers(arm.joints)
                elif command == "MOVE":
                    arm.wait_for_tick()
                    answer = _numbers(arm.move(_floats(args)))
                    moves += 1
                elif command == "GOTO":
                    answer = _numbers(arm.goto(_floats(args)))
                elif command == "HOLD":
                    answer = _numbers(arm.hold())
                elif command == "STATUS":
                    answer = f"fault=none temp_c=38.0 holds={arm.holds}"
                else:
                    raise ValueError(f"unknown command {command}")
                self.wfile.write(f"OK {answer}\n".encode())
            except (ValueError, IndexError) as exc:
                self.wfile.write(f"ERR {exc}\n".encode())


def _floats(args: list[str]) -> list[float]:
    if len(args) != JOINTS:
        raise ValueError(f"expected {JOINTS} numbers, got {len(args)}")
    return [float(a) for a in args]


def _numbers(values: list[float]) -> str:
    return " ".join(f"{v:.6f}" for v in values)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:7700", help="HOST:PORT (port 0: any free one, printed)")
    parser.add_argument("--rate-hz", type=float, default=50.0, help="the arms' control rate")
    parser.add_argument(
        "--hang",
        action="append",
        default=[],
        metavar="ARM:N",
        help="stop answering ARM after N moves on a connection (repeatable)",
    )
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    hang = {arm: int(n) for arm, _, n in (item.rpartition(":") for item in args.hang)}
    with Controller((host, int(port)), args.rate_hz, hang) as server:
        bound_host, bound_port = server.server_address[:2]
        print(f"example arm controller listening on {bound_host}:{bound_port} at {args.rate_hz:g} Hz", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    sys.exit(main())
