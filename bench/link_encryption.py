"""What CurveZMQ costs on the wire: messages/s and MB/s of batch-sized messages from a DEALER to a
ROUTER over loopback TCP, encrypted and authenticated (ours: the learner's gatekeeper admitting an
enrolled key) against the same sockets in the clear (raw baseline), in the same run.

Sizes: a state batch (64 transitions of an 18-float state: ~8 KiB) and an image batch (32 raw
64x64x3 frames: ~384 KiB). The receiver acknowledges every `--window` messages so the sender never
runs unboundedly ahead (like the data link's in-flight window). Each repeat runs clear, then curve;
the table shows the medians and the ratio curve / clear (1.0: free).

    python bench/link_encryption.py [--seconds 3] [--repeats 3] [--out curve.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import zmq

from user_rl.security.curve import ClientKeys, Gatekeeper, secure_server
from user_rl.security.keys import generate

SIZES = {"state batch": 64 * (18 * 4 * 2 + 32), "image batch": 32 * 64 * 64 * 3}


def measure(size: int, seconds: float, window: int, keys_dir: Path | None) -> float:
    """Messages per second for `seconds`, one sender and one receiver thread."""
    context = zmq.Context()
    gate = Gatekeeper(context, keys_dir) if keys_dir else None
    server = context.socket(zmq.ROUTER)
    if gate:
        secure_server(server, gate.keys)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client = context.socket(zmq.DEALER)
    if keys_dir:
        ClientKeys.for_robot(keys_dir, "bench-0").apply(client)
    client.connect(f"tcp://127.0.0.1:{port}")
    payload = bytes(size)
    received = [0]
    stop = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            if server.poll(50):
                identity, _ = server.recv_multipart(copy=False)
                received[0] += 1
                if received[0] % window == 0:
                    server.send_multipart([identity, b"ack"])

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    sent, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(window):
            client.send(payload, copy=False)
        sent += window
        assert client.poll(10_000), "no ack"
        client.recv()
    elapsed = time.perf_counter() - started
    stop.set()
    thread.join()
    for socket in (client, server):
        socket.close(0)
    if gate:
        gate.close()
    context.term()
    return sent / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        keys_dir = Path(tmp) / "keys"
        generate(keys_dir, ["bench-0"])
        print(
            f"{'message':<12} {'bytes':>8} {'clear msg/s':>12} {'curve msg/s':>12} {'clear MB/s':>11} "
            f"{'curve MB/s':>11} {'curve/clear':>12}"
        )
        for name, size in SIZES.items():
            clear, curve = [], []
            for _ in range(args.repeats):
                clear.append(measure(size, args.seconds, args.window, None))
                curve.append(measure(size, args.seconds, args.window, keys_dir))
            c, e = statistics.median(clear), statistics.median(curve)
            ratio = statistics.median(b / a for a, b in zip(clear, curve))
            results[name] = {"bytes": size, "clear_msgs_per_s": c, "curve_msgs_per_s": e, "ratio": ratio}
            print(
                f"{name:<12} {size:>8,} {c:>12,.0f} {e:>12,.0f} {c * size / 1e6:>11,.1f} {e * size / 1e6:>11,.1f} "
                f"{ratio:>12.2f}"
            )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
