"""An edge that only receives policy versions, as a process of its own, for tests: a real
`WeightReceiver` whose process a test can slow down, stop (SIGSTOP) and resume.

    python -m tests.support.weight_edge tcp://127.0.0.1:5555 [resend_s]

It prints one JSON line on start ({"ready": true}) and one per version it hands over: the version,
each tensor's smallest and largest value (a test fills every element of version v with v, so a
version made of two shows as min != max) and the receiver's counters. `WeightEdge` starts one and
collects its lines on a thread.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["WeightEdge"]
REPO = Path(__file__).resolve().parents[2]  # `-m tests.support.weight_edge` is found from the checkout's root


class WeightEdge:
    """The test's handle on one edge process: its reports, and signals to stop and resume it."""

    def __init__(self, address: str, resend_s: float = 1.0) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.weight_edge", address, str(resend_s)],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
            cwd=REPO,
        )
        self.reports: list[dict] = []  # one per version handed over, in order, stamped with the test's clock
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            report = json.loads(line)
            if report.get("ready"):
                self.ready.set()
            else:
                report["at"] = time.monotonic()
                self.reports.append(report)

    @property
    def version(self) -> int:
        return self.reports[-1]["version"] if self.reports else -1

    def torn(self) -> list[dict]:
        """Versions handed over whose tensors are not all the version's number."""
        return [
            r for r in self.reports if any(lo != r["version"] or hi != r["version"] for lo, hi in r["range"].values())
        ]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.process.send_signal(signal.SIGCONT)  # a stopped process does not act on SIGKILL's exit until resumed
        self.process.kill()
        self.process.wait(10)


def main(argv: list[str]) -> None:
    import torch
    import zmq

    from user_rl.edge.weights import WeightReceiver

    torch.set_num_threads(1)  # several edges share the test's cores
    receiver = WeightReceiver(zmq.Context(), argv[0], resend_s=float(argv[1]) if len(argv) > 1 else 1.0)
    print(json.dumps({"ready": True}), flush=True)
    while True:
        got = receiver.poll_new()
        if got is None:
            time.sleep(0.005)
            continue
        version, state = got
        ranges = {name: (float(t.min()), float(t.max())) for name, t in state.items() if t.numel()}
        del state  # the policy "loaded" it: its buffer may take the next version
        print(
            json.dumps(
                {
                    "version": version,
                    "range": ranges,
                    "checksum_failures": receiver.checksum_failures,
                    "duplicate_chunks": receiver.duplicate_chunks,
                    "errors": receiver.errors,
                    "failures": receiver.failures,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
