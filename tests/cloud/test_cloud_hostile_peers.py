"""A hostile peer costs the learner bounded memory and time (issue 29, point 13): 10,000 hellos that
name unknown epochs (256 each) and 3,000 fresh identities, while an honest robot streams. The
ingest is served in this process (its RSS and per-message time are measured); the peers run in a
child process over real sockets. Streams are made only for epochs that send data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tests.cloud.test_cloud_bounds import rss_mib
from tests.cloud.test_cloud_ingest import ACTION_SPACE, OBS_SPACE
from user_rl.cloud.buffer.index import BufferIndex
from user_rl.cloud.ingest import Ingest
from user_rl.cloud.lives import MAX_SPOOLED_EPOCHS

REPO = Path(__file__).resolve().parents[2]
HELLOS, IDENTITIES, DATA_EPOCHS = 10_000, 3_000, 20
WINDOW = 1_000  # per-message p99 is checked over every window of this many messages ("throughout")

PEERS = r"""
import json, sys, threading, time
import numpy as np, zmq
from tests.cloud.test_cloud_ingest import ACTION_SPACE, OBS_SPACE, Episodes, hello_envelope
from user_rl.edge.link import DataLink, LinkSettings
from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import decode, encode, envelope

endpoint, spool, hellos, identities, data_epochs, named = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
ctx = zmq.Context()
honest = DataLink(ctx, endpoint, DeviceDescriptor("sim", "test", "honest"), OBS_SPACE, ACTION_SPACE,
                  settings=LinkSettings(spool_dir=spool))
robot, done = Episodes(50), threading.Event()

def stream():
    honest.hello()
    while not done.is_set():
        honest.send_batch(*robot.batch(10))
        deadline = time.monotonic() + 0.05
        while time.monotonic() < deadline:
            honest.poll(10)
    deadline = time.monotonic() + 60
    while honest.unacked and time.monotonic() < deadline:
        honest.poll(20)

thread = threading.Thread(target=stream, daemon=True)
thread.start()
rng = np.random.default_rng(0)
flooders = []
for k in range(10):  # 10 connections, 1,000 hellos each, every one naming 256 epochs nobody knows
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    flooders.append(s)
last = {}

def drain(k, wait_ms=0):
    # read the flooder's replies; True once the learner answered its last hello
    while flooders[k].poll(wait_ms):
        reply = decode(flooders[k].recv_multipart())
        if reply.kind == "ack" and reply.body.stream_epoch == last[k]:
            return True
    return False

started = time.monotonic()
for i in range(hellos):
    k = i % len(flooders)
    epoch = last[k] = 10**12 + i
    env = hello_envelope(f"hostile-{k}", epoch)
    env.hello.spooled_epochs.extend(sorted(set(rng.integers(1, epoch, named).tolist())))
    flooders[k].send_multipart(encode(env))
    drain(k)
    if i < data_epochs:  # a few of them do send data: one batch of a named epoch (its stream is made)
        count, cols = Episodes(50).batch(5)
        body = pb.TransitionBatch(stream_epoch=env.hello.spooled_epochs[0], seq=1, count=count)
        flooders[k].send_multipart(encode(envelope(f"hostile-{k}", batch=body), cols))
for k in range(len(flooders)):  # every hello was handled (acks come in order)
    deadline = time.monotonic() + 120
    while not drain(k, 100):
        assert time.monotonic() < deadline, "the learner never answered the last hellos"
flood_s = time.monotonic() - started
answered = 0
for wave in range(0, identities, 200):  # fresh identities, each a new connection with a junk robot id
    wave_sockets = []
    for i in range(wave, min(identities, wave + 200)):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        s.send_multipart(encode(hello_envelope(f"junk-{i}", 1)))
        wave_sockets.append(s)
    for s in wave_sockets:  # its answer came: the hello was handled (and the descriptor can close)
        answered += bool(s.poll(5000))
        s.close()
done.set()
thread.join()
outcome = {"flood_s": flood_s, "junk_answered": answered}
outcome.update(honest_seq=honest.seq, honest_unacked=honest.unacked, honest_epoch=honest.epoch)
print(json.dumps(outcome), flush=True)
honest.close()
for s in flooders:
    s.close()
ctx.term()
"""


def test_hostile_hellos_and_fresh_identities_cost_bounded_memory_and_time(context, tmp_path: Path) -> None:
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer")
    times: list[float] = []
    handle = ingest._handle

    def timed(identity, msg) -> None:  # the ingest thread's own work for one message
        t0 = time.perf_counter()
        try:
            handle(identity, msg)
        finally:
            times.append(time.perf_counter() - t0)

    ingest._handle = timed
    ingest.open_buffer(OBS_SPACE, ACTION_SPACE)  # a learner that already runs: its buffer is open
    for _ in range(20):
        ingest.poll(5)
    rss_before = rss_mib()
    log = open(tmp_path / "peers.log", "w")  # not a pipe: a full pipe would stall the peers
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    peers = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PEERS,
            ingest.endpoint,
            str(tmp_path / "spool"),
            str(HELLOS),
            str(IDENTITIES),
            str(DATA_EPOCHS),
            str(MAX_SPOOLED_EPOCHS),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    started, rss_peak = time.monotonic(), rss_before
    try:
        while peers.poll() is None:
            assert time.monotonic() - started < 90, f"the peers did not finish: {len(times)} messages handled"
            ingest.poll(20, max_messages=64)
            rss_peak = max(rss_peak, rss_mib())
        for _ in range(20):
            ingest.poll(5)
        out, _ = peers.communicate(timeout=10)
        assert peers.returncode == 0, (tmp_path / "peers.log").read_text()[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
        handled = len(times)
        ingest.maybe_commit(force=True)
        report = ingest.report()
    finally:
        if peers.poll() is None:
            peers.kill()
        log.close()
        print((tmp_path / "peers.log").read_text()[-2000:])
        ingest.close()
    index = BufferIndex(tmp_path / "buffer" / "index.sqlite", read_only=True)
    try:
        streams = index.streams()
        honest_batches = sum(1 for r, _, _ in index.batch_keys() if r == "honest")
    finally:
        index.close()
    windows = [
        float(np.percentile(times[i : i + WINDOW], 99)) * 1000 for i in range(0, len(times) - WINDOW + 1, WINDOW)
    ]
    print(
        f"\nhostile peers: {handled} messages in {time.monotonic() - started:.1f} s (flood sent in "
        f"{result['flood_s']:.1f} s); per-message p99 by window of {WINDOW}: max {max(windows):.2f} ms, "
        f"median {np.median(windows):.2f} ms, max single {max(times) * 1000:.1f} ms; RSS {rss_before:.0f} -> "
        f"peak {rss_peak:.0f} MiB (+{rss_peak - rss_before:.1f}); streams made {len(streams)}; rate-limited "
        f"{sum(c.get('rate_limited', 0) for c in report['rejected_by_peer'].values())}"
    )
    assert result["honest_unacked"] == 0 and honest_batches == result["honest_seq"], "the honest robot was starved"
    assert handled >= HELLOS + IDENTITIES, f"only {handled} messages reached the ingest: {result}"
    assert len(streams) <= 1 + DATA_EPOCHS, f"{len(streams)} streams for {1 + DATA_EPOCHS} epochs that sent data"
    assert rss_peak - rss_before <= 50, f"learner RSS grew by {rss_peak - rss_before:.1f} MiB"
    assert max(windows) <= 20, f"per-message p99 reached {max(windows):.1f} ms"
