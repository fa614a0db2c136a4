"""A `WeightServer` in a thread of its own (it owns its socket), for tests: publishes are handed
over through a queue, as the learner's ingest thread would publish them."""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping

import torch
import zmq

from user_rl.cloud.weight_server import WeightServer
from user_rl.wire.weights import PackedWeights


class ServerThread:
    def __init__(self, context: zmq.Context, **options) -> None:
        """`options`: for the `WeightServer` (e.g. `claim_timeout_s`)."""
        self.server = WeightServer(context, "tcp://127.0.0.1:0", **options)
        self.endpoint = self.server.endpoint
        self._jobs: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                while not self._jobs.empty():
                    version, weights, done = self._jobs.get()
                    self.server.publish(version, weights)
                    done.set()
                self.server.poll(10)
        finally:
            self.server.close()

    def publish(self, version: int, weights: Mapping[str, torch.Tensor] | PackedWeights) -> None:
        """Publish `weights` (a state dict, or packed already) as `version`; returns once published."""
        done = threading.Event()
        self._jobs.put((version, weights, done))
        if not done.wait(10.0):
            raise TimeoutError(f"the weight server did not publish version {version} within 10 s")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10.0)
