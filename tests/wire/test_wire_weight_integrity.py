"""Policy versions stay whole, and hung edges do not stop publishing (issue 29, points 5 and 12).

Real parts: the trainer's shared `ActorBuffers` (three, reused as the server hands them back), the
learner's `WeightServer` on a thread, and edges that are processes of their own running a real
`WeightReceiver`, over TCP (through a bandwidth-capped proxy for the slow edge). Every element of
version v is v, so a version assembled from two buffers shows as a range, not a single value.
"""

from __future__ import annotations

import time

import torch
import zmq
from torch import nn

from tests.support.weight_edge import WeightEdge
from tests.support.weight_server import ServerThread
from user_rl.cloud.actor_buffers import ActorBuffers
from user_rl.testing.fault_proxy import FaultProxy
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import encode, envelope

KIB, MIB = 1 << 10, 1 << 20


class Filled(nn.Module):
    """A policy of `nbytes` float32 (in two tensors when `tail_bytes`), every element set to the version."""

    def __init__(self, nbytes: int, tail_bytes: int = 0) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(nbytes // 4))
        if tail_bytes:
            self.tail = nn.Parameter(torch.zeros(tail_bytes // 4))

    def set(self, version: int) -> None:
        with torch.no_grad():
            for p in self.parameters():
                p.fill_(version)


def publish(server: ServerThread, buffers: ActorBuffers, model: Filled, version: int) -> bool:
    """As the trainer and the learner do: write into a free shared buffer and serve it; False (the
    trainer skips the publish) when the server holds every buffer still."""
    model.set(version)
    index = buffers.write(model)
    if index is None:
        return False
    server.publish(version, buffers.packed(index))
    return True


def test_a_slow_edge_never_applies_a_version_made_of_two(context) -> None:
    # 48 MiB + 10 KiB: the last chunk of each version is under 64 KiB, so pyzmq copies it and reports it
    # sent at once, while the 1 MiB chunks before it still view the buffer (more of them than the
    # socket buffers on the way take: loopback receive buffers grow to 32 MiB here).
    model = Filled(48 * MIB, 10 * KIB)
    buffers = ActorBuffers(model)
    server = ServerThread(context)
    with FaultProxy(server.endpoint, bandwidth_bps=64e6) as link:  # 8 MB/s: a slow edge
        edge = WeightEdge(link.address)
        try:
            assert edge.ready.wait(60), "the edge process did not start"
            wait_until(lambda: server.server.waiting, 20, "the edge's request")
            assert publish(server, buffers, model, 1)  # the edge starts receiving v1 ...
            time.sleep(0.5)
            assert publish(server, buffers, model, 2)  # ... v1 is replaced while the edge still receives it ...
            assert publish(server, buffers, model, 3)  # ... and the trainer writes into whatever came back
            link.set(bandwidth_bps=None)  # the rest at loopback speed, to keep the test short
            wait_until(lambda: edge.version == 3, 40, "the slow edge on version 3")
            print(
                f"the edge applied {[r['version'] for r in edge.reports]}; "
                f"checksum failures {edge.reports[-1]['checksum_failures']}"
            )
            assert edge.torn() == [], f"versions made of two: {edge.torn()}"
            assert [r["version"] for r in edge.reports] == [1, 3]  # v1 whole (its buffer was held), then the newest
            assert edge.reports[-1]["checksum_failures"] == 0
        finally:
            edge.close()
    server.close()


CLAIM_S = 2.0  # the claim timeout this test runs the server with
HUNG_S = 30.0  # how long two edges stay stopped (the 30 s): fifteen claim timeouts
PUBLISH_EVERY_S = 0.25


def test_hung_edges_lose_their_claim_so_publishing_goes_on_and_they_catch_up(context) -> None:
    # 64 MiB in 1 MiB chunks, each a view of the buffer: more than a stopped edge's socket buffers take
    # (loopback receive buffers grow to 32 MiB here), so the rest waits in ZeroMQ and reads the buffer
    # when the edge resumes.
    model = Filled(64 * MIB)
    buffers = ActorBuffers(model)  # three, as the trainer has
    server = ServerThread(context, claim_timeout_s=CLAIM_S)
    edges = [WeightEdge(server.endpoint) for _ in range(3)]
    hung_a, hung_b, live = edges
    try:
        for edge in edges:
            assert edge.ready.wait(60), "an edge process did not start"
        wait_until(lambda: len(server.server.waiting) == 3, 20, "three edges asking")
        version = 1
        assert publish(server, buffers, model, version)
        wait_until(
            lambda: all(e.version == 1 for e in edges) and len(server.server.waiting) == 3,
            20,
            "every edge on version 1 and asking again",
        )
        hung_a.stop()  # hangs while connected, its request served: v2 goes out to it and stalls
        version = 2
        assert publish(server, buffers, model, version)
        wait_until(lambda: hung_b.version == live.version == 2 and len(server.server.waiting) == 2, 20, "v2")
        hung_b.stop()  # stalls on v3
        version = 3
        assert publish(server, buffers, model, version)
        wait_until(lambda: live.version == 3, 20, "the live edge on v3")

        stopped_at = time.monotonic()
        published, skipped, most_held = [], 0, 0
        while time.monotonic() - stopped_at < HUNG_S:
            if publish(server, buffers, model, version + 1):
                version += 1
                published.append((time.monotonic() - stopped_at, version))
            else:
                skipped += 1
            most_held = max(most_held, len(buffers.busy) - buffers.free, server.server.held_buffers)
            time.sleep(PUBLISH_EVERY_S)
        resumed_at = time.monotonic()
        hung_a.resume()
        hung_b.resume()
        wait_until(lambda: all(e.version == version for e in edges), 30, f"every edge on the newest, v{version}")
        caught_up_s = time.monotonic() - resumed_at

        got = [(r["at"] - stopped_at, r["version"]) for r in live.reports if r["at"] <= resumed_at]
        failures = [max(r["checksum_failures"] for r in e.reports) for e in edges]
        duplicates = [e.reports[-1]["duplicate_chunks"] for e in edges]
        print(
            f"while two edges hung {HUNG_S:.0f} s: {len(published)} published, {skipped} skipped; the live edge "
            f"got {len([t for t, _ in got if t > 0])} versions; claims dropped {server.server.dropped_claims}; "
            f"buffers held at most {most_held}; caught up {caught_up_s:.1f} s after resuming; "
            f"checksum failures {failures}; chunks received twice {duplicates}"
        )
        # The live edge receives new versions throughout, after the claim timeout too.
        for start in range(int(CLAIM_S) + 2, int(HUNG_S), 3):
            assert any(start <= t < start + 3 for t, _ in got), (
                f"the live edge got nothing in [{start}, {start + 3}) s: {got}"
            )
        assert skipped <= (CLAIM_S + 2.0) / PUBLISH_EVERY_S  # only until the hung edges' claims were dropped
        assert server.server.dropped_claims >= 2
        assert most_held <= 3  # the trainer's three buffers, never more, however long the edges hang
        for edge in edges:
            assert edge.torn() == [], f"versions made of two: {edge.torn()}"
        assert failures[2] == 0  # the live edge never got overwritten bytes
        assert failures[0] + failures[1] >= 1  # a hung edge got bytes overwritten after its claim went: refetched
    finally:
        for edge in edges:
            edge.close()
        server.close()


def test_a_peer_that_asks_again_and_again_but_never_reads_gets_one_copy_queued(context) -> None:
    model = Filled(64 * MIB)  # more than the socket buffers on the way take: the rest stays queued
    buffers = ActorBuffers(model)
    server = ServerThread(context, claim_timeout_s=CLAIM_S)
    peer = context.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.RCVHWM, 1)  # its ZeroMQ takes one message off the wire and then no more
    peer.connect(server.endpoint)
    try:
        assert publish(server, buffers, model, 1)
        request = encode(envelope(weights_request=pb.WeightsRequest(have_version=-1)))
        for _ in range(20):
            peer.send_multipart(request)
            time.sleep(0.02)
        wait_until(lambda: server.server.deferred_requests >= 19, 10, "the requests to arrive")
        print(
            f"20 requests, never read: sent {server.server.sent_versions} versions "
            f"({server.server.sent_bytes / MIB:.0f} MiB), {server.server.deferred_requests} requests deferred"
        )
        assert server.server.sent_versions == 1 and server.server.sent_bytes == 64 * MIB  # one copy, not 20
        assert publish(server, buffers, model, 2)  # v1 replaced: the peer's claim on it goes after CLAIM_S
        wait_until(lambda: server.server.dropped_claims == 1, CLAIM_S + 10, "the stalled peer's claim dropped")
        assert buffers.free == 2  # only the newest is held
    finally:
        peer.close(0)
        server.close()
