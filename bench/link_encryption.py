"""What CurveZMQ costs on the wire: messages/s and MB/s of batch-sized messages from a DEALER to a
ROUTER over loopback TCP, encrypted and authenticated (ours: the learner's gatekeeper admitting an
enrolled key) against the same sockets in the clear (raw baseline), in the same run.

Sizes: a state batch (64 transitions of an 18-float state: ~11 KiB) and an image batch (32 raw
64x64x3 frames: ~384 KiB). The receiver acknowledges every `--window` messages so the sender never
runs unboundedly ahead (like the data link's in-flight window). Each end has its own ZeroMQ context,
so its own I/O thread, as an edge and a learner do (they are separate processes): the sender's
encrypts while the receiver's decrypts. Each repeat runs clear, then curve; the table shows the
medians and the ratio curve / clear (1.0: free).

Two more rows answer what a user asks:
- the ceiling: libsodium's own rate for CurveZMQ's cipher (XSalsa20-Poly1305, `crypto_box_afternm`
  and `crypto_box_open_afternm` of one image batch, from the libsodium that pyzmq loads) on one
  core of this CPU. CurveZMQ cannot go faster than that on one side of the link, whatever ZeroMQ
  does; loopback TCP in the clear is a memory copy, several times faster.
- a real network: the image batch through a 1 Gbit/s link (the project's FaultProxy, a token
  bucket, in a process of its own), clear against curve: does encryption slow a robot's uplink?

    python bench/link_encryption.py [--seconds 3] [--repeats 3] [--out curve.json]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import zmq

from user_rl.security.curve import ClientKeys, Gatekeeper, secure_server
from user_rl.security.keys import generate

SIZES = {"state batch": 64 * (18 * 4 * 2 + 32), "image batch": 32 * 64 * 64 * 3}
IMAGE = "image batch"
NETWORK_BPS = 1e9  # the bandwidth-limited link: 1 Gbit/s, a wired robot cell's Ethernet


def measure(size: int, seconds: float, window: int, keys_dir: Path | None, via: str | None = None) -> float:
    """Messages per second for `seconds`, one sender and one receiver thread, each end with its own
    context (I/O thread). `via`: connect through this proxy address (whose upstream is the receiver)
    instead of straight to the receiver."""
    server_context, client_context = zmq.Context(), zmq.Context()
    gate = Gatekeeper(server_context, keys_dir) if keys_dir else None
    server = server_context.socket(zmq.ROUTER)
    if gate:
        secure_server(server, gate.keys)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client = client_context.socket(zmq.DEALER)
    if keys_dir:
        ClientKeys.for_robot(keys_dir, "bench-0").apply(client)
    proxy = _Proxy(f"tcp://127.0.0.1:{port}") if via else None
    client.connect(proxy.address if proxy else f"tcp://127.0.0.1:{port}")
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
        assert client.poll(30_000), "no ack"
        client.recv()
    elapsed = time.perf_counter() - started
    stop.set()
    thread.join()
    for socket in (client, server):
        socket.close(0)
    if proxy:
        proxy.close()
    if gate:
        gate.close()
    server_context.term()
    client_context.term()
    return sent / elapsed


def _serve_proxy(upstream: str, bandwidth_bps: float, address: mp.Queue, stop: mp.Event) -> None:
    from user_rl.testing.fault_proxy import FaultProxy

    with FaultProxy(upstream, bandwidth_bps=bandwidth_bps) as proxy:
        address.put(proxy.address)
        stop.wait()


class _Proxy:
    """A 1 Gbit/s FaultProxy in a process of its own (its Python pump must not share the bench's GIL)."""

    def __init__(self, upstream: str, bandwidth_bps: float = NETWORK_BPS) -> None:
        spawn = mp.get_context("spawn")
        queue, self._stop = spawn.Queue(), spawn.Event()
        self._process = spawn.Process(target=_serve_proxy, args=(upstream, bandwidth_bps, queue, self._stop))
        self._process.start()
        self.address = queue.get(timeout=60)

    def close(self) -> None:
        self._stop.set()
        self._process.join(30)


def crypto_rate(size: int, seconds: float = 1.0) -> dict[str, float] | None:
    """Bytes/s of libsodium's crypto_box_afternm (encrypt) and crypto_box_open_afternm (decrypt) of
    one `size`-byte message on one core: what CurveZMQ calls per message. None if the libsodium
    pyzmq uses cannot be found (a pyzmq built against a system libzmq: then look there)."""
    import zmq as zmq_module

    site = Path(zmq_module.__file__).resolve().parents[1]
    found = sorted(glob.glob(str(site / "pyzmq.libs" / "libsodium*.so*")))
    try:
        lib = ctypes.CDLL(found[0] if found else "libsodium.so")
    except OSError:
        return None
    if lib.sodium_init() < 0:
        return None
    zero = 32  # crypto_box_ZEROBYTES: the NaCl API CurveZMQ uses pads the message with this
    key, nonce = ctypes.create_string_buffer(32), ctypes.create_string_buffer(24)
    plain, box = ctypes.create_string_buffer(size + zero), ctypes.create_string_buffer(size + zero)
    length = ctypes.c_ulonglong(size + zero)
    assert lib.crypto_box_afternm(box, plain, length, nonce, key) == 0
    rates = {}
    for name, fn, src, dst in (
        ("encrypt", lib.crypto_box_afternm, plain, box),
        ("decrypt", lib.crypto_box_open_afternm, box, plain),
    ):
        calls, started = 0, time.thread_time()
        while time.thread_time() - started < seconds / 2:
            assert fn(dst, src, length, nonce, key) == 0
            calls += 1
        rates[name] = calls * size / (time.thread_time() - started)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        keys_dir = Path(tmp) / "keys"
        generate(keys_dir, ["bench-0"])
        print(
            f"{'message':<28} {'bytes':>8} {'clear msg/s':>12} {'curve msg/s':>12} {'clear MB/s':>11} "
            f"{'curve MB/s':>11} {'curve/clear':>12}"
        )
        rows = [(name, size, None) for name, size in SIZES.items()]
        rows.append((f"{IMAGE} (1 Gbit/s link)", SIZES[IMAGE], "proxy"))
        for name, size, via in rows:
            clear, curve = [], []
            for _ in range(args.repeats):
                clear.append(measure(size, args.seconds, args.window, None, via))
                curve.append(measure(size, args.seconds, args.window, keys_dir, via))
            c, e = statistics.median(clear), statistics.median(curve)
            ratio = statistics.median(b / a for a, b in zip(clear, curve))
            results[name] = {"bytes": size, "clear_msgs_per_s": c, "curve_msgs_per_s": e, "ratio": ratio}
            if via:
                results[name]["link_bps"] = NETWORK_BPS
            print(
                f"{name:<28} {size:>8,} {c:>12,.0f} {e:>12,.0f} {c * size / 1e6:>11,.1f} {e * size / 1e6:>11,.1f} "
                f"{ratio:>12.2f}"
            )
    rates = crypto_rate(SIZES[IMAGE])
    if rates is not None:
        clear = results[IMAGE]["clear_msgs_per_s"] * SIZES[IMAGE]
        # One message is encrypted on one side and decrypted on the other: each side's I/O thread
        # does one of them, so the slower of the two bounds the link.
        ceiling = min(rates.values())
        results["crypto_ceiling"] = {
            "bytes": SIZES[IMAGE],
            "encrypt_bytes_per_s": rates["encrypt"],
            "decrypt_bytes_per_s": rates["decrypt"],
            "msgs_per_s": ceiling / SIZES[IMAGE],
            "vs_clear": ceiling / clear,
            "cores": os.cpu_count(),
        }
        print(
            f"libsodium on one core: encrypt {rates['encrypt'] / 1e6:,.0f} MB/s, decrypt {rates['decrypt'] / 1e6:,.0f} "
            f"MB/s: at most {ceiling / SIZES[IMAGE]:,.0f} {IMAGE} messages/s, {ceiling / clear:.2f}x the clear "
            f"loopback link ({clear / 1e6:,.0f} MB/s)"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
