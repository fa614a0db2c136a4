"""Policy weights: chunked packing and reassembly, and the live long-poll server + receiver."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import zmq

from tests.support.weight_server import ServerThread
from user_rl.edge.weights import WeightReceiver
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import WireError, decode, encode, envelope
from user_rl.wire.weights import WeightsAssembly, pack


def actor_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "encoder.weight": torch.randn(7, 5, generator=g),
        "encoder.bias": torch.randn(7, generator=g),
        "head.weight": torch.randn(3, 7, generator=g) * 100,
        "head.bias": torch.zeros(0),  # empty tensor
        "steps": torch.tensor(123456789, dtype=torch.int64),  # 0-d, not a float
        "mask": torch.tensor([True, False, True]),
    }


def assemble(packed, order=None) -> dict[str, torch.Tensor]:
    asm = WeightsAssembly(packed.announce)
    indices = list(order if order is not None else range(len(packed.chunks)))
    for n, i in enumerate(indices):
        done = asm.add(i, packed.chunks[i])
        assert done == (n == len(indices) - 1)
    return asm.state()


def test_float32_roundtrip_in_many_chunks_is_exact() -> None:
    state = actor_state()
    packed = pack(7, state, chunk_bytes=16)
    payload = sum(t.numel() * t.element_size() for t in state.values())
    total = packed.announce.total_bytes  # each tensor starts 8-byte aligned, to be read in place
    assert packed.announce.version == 7
    assert payload <= total < payload + 8 * len(state)
    assert packed.announce.num_chunks == len(packed.chunks) == -(-total // 16) > 5
    assert all(len(c) == 16 for c in packed.chunks[:-1])
    # Chunks may arrive in any order.
    got = assemble(packed, order=reversed(range(len(packed.chunks))))
    assert list(got) == list(state)
    for name, tensor in state.items():
        assert got[name].dtype == tensor.dtype, name
        assert got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name


def test_bfloat16_roundtrip_is_approximate_and_half_the_bytes() -> None:
    state = actor_state(1)
    full = pack(1, state, chunk_bytes=10)
    half = pack(1, state, cast_floats_to=torch.bfloat16, chunk_bytes=10)
    float_bytes = sum(t.numel() * 4 for t in state.values() if t.is_floating_point())
    saved = full.announce.total_bytes - half.announce.total_bytes
    assert abs(saved - float_bytes // 2) < 8 * len(state)  # alignment padding aside
    got = assemble(half)
    for name, tensor in state.items():
        if tensor.is_floating_point():
            assert got[name].dtype == torch.bfloat16, name
            torch.testing.assert_close(got[name].float(), tensor, rtol=1e-2, atol=1e-2)
        else:  # integers and masks are never cast
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_assembly_refuses_wrong_chunks() -> None:
    packed = pack(3, actor_state(), chunk_bytes=32)
    asm = WeightsAssembly(packed.announce)
    with pytest.raises(WireError) as info:
        asm.add(0, packed.chunks[0][:-1])  # short chunk
    assert info.value.reason == "bad_chunk"
    with pytest.raises(WireError) as info:
        asm.add(0, bytes(packed.chunks[0]) + b"\x00")  # long chunk
    assert info.value.reason == "bad_chunk"
    last = len(packed.chunks) - 1
    with pytest.raises(WireError) as info:
        asm.add(last, packed.chunks[0])  # the last chunk is shorter than chunk_bytes
    assert info.value.reason == "bad_chunk"
    with pytest.raises(WireError) as info:
        asm.add(len(packed.chunks), packed.chunks[0])  # no such chunk
    assert info.value.reason == "bad_chunk"
    assert asm.missing == set(range(len(packed.chunks)))  # nothing was stored


def test_each_part_carries_a_checksum_that_catches_bytes_not_as_published() -> None:
    packed = pack(4, actor_state(), chunk_bytes=32, frozen=["encoder.weight"])
    announce = packed.announce
    assert announce.HasField("crc32") and announce.base.HasField("crc32")
    asm = WeightsAssembly(announce)
    for i, chunk in enumerate(packed.chunks):
        asm.add(i, bytes(chunk) if i else b"\x01" + bytes(chunk)[1:])  # one byte differs from what was published
    assert asm.complete and not asm.intact()
    asm.add(0, packed.chunks[0])
    assert asm.intact()
    announce.ClearField("crc32")  # a version without one is refused, never applied unchecked
    with pytest.raises(WireError, match="no checksum") as info:
        WeightsAssembly(announce)
    assert info.value.reason == "bad_announce"


def test_inconsistent_announce_is_refused() -> None:
    announce = pb.WeightsAnnounce(version=1, total_bytes=100, num_chunks=2, chunk_bytes=10)
    with pytest.raises(WireError) as info:
        WeightsAssembly(announce)
    assert info.value.reason == "bad_announce"
    # A layout that runs past its bytes is refused before any chunk is taken.
    announce = pb.WeightsAnnounce(
        version=1,
        total_bytes=8,
        num_chunks=1,
        chunk_bytes=8,
        tensors=[pb.ArraySpec(name="w", dtype="float32", shape=[4])],
    )
    with pytest.raises(WireError) as info:
        WeightsAssembly(announce)
    assert info.value.reason == "bad_announce"
    announce.tensors[0].shape[:] = [-2, 2]  # and so is a shape no tensor has
    announce.total_bytes = announce.chunk_bytes = 16
    with pytest.raises(WireError) as info:
        WeightsAssembly(announce)
    assert info.value.reason == "bad_shape"


# -- live: WeightServer <-> WeightReceiver over real sockets ---------------------------------


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.term()


def test_late_receiver_gets_the_latest_version_then_the_next(context: zmq.Context) -> None:
    server = ServerThread(context)
    receiver = None
    try:
        server.publish(1, actor_state(1))
        v2 = actor_state(2)
        server.publish(2, v2)
        receiver = WeightReceiver(context, server.endpoint, resend_s=5.0)
        version, state = receiver.wait_for(0, timeout=5.0)
        assert version == 2  # not the stale v1
        for name in v2:
            assert torch.equal(state[name], v2[name]), name
        assert receiver.version == 2
        assert receiver.poll_new() is None  # handed over once

        v3 = actor_state(3)
        server.publish(3, v3)
        version, state = receiver.wait_for(3, timeout=5.0)
        assert version == 3
        assert all(torch.equal(state[n], v3[n]) for n in v3)

        start = time.monotonic()
        with pytest.raises(TimeoutError):
            receiver.wait_for(4, timeout=0.3)
        assert time.monotonic() - start < 2.0
        assert receiver.errors == 0
        assert server.server.sent_versions == 2  # v2 and v3 only; never v1 to this edge
    finally:
        if receiver is not None:
            receiver.close()
        server.close()


def test_receiver_polls_new_versions_without_blocking(context: zmq.Context) -> None:
    server = ServerThread(context)
    receiver = WeightReceiver(context, server.endpoint)
    try:
        assert receiver.poll_new() is None  # nothing published: no wait, no crash
        server.publish(5, actor_state(5))
        deadline = time.monotonic() + 5.0
        got = None
        while got is None and time.monotonic() < deadline:
            got = receiver.poll_new()
            time.sleep(0.01)
        assert got is not None and got[0] == 5
    finally:
        receiver.close()
        server.close()


def test_server_rejects_other_messages_and_keeps_serving(context: zmq.Context) -> None:
    server = ServerThread(context)
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(server.endpoint)
    try:
        dealer.send_multipart([b"garbage\xff\xff"])
        assert dealer.poll(5000)
        reply = decode(dealer.recv_multipart())
        assert reply.kind == "reject" and reply.body.reason.startswith("undecodable")
        dealer.send_multipart(encode(envelope(ack=pb.Ack())))
        assert dealer.poll(5000)
        assert decode(dealer.recv_multipart()).body.reason.startswith("unexpected")

        server.publish(1, {"w": torch.arange(6, dtype=torch.float32)})
        dealer.send_multipart(encode(envelope(weights_request=pb.WeightsRequest(have_version=-1))))
        assert dealer.poll(5000)
        announce = decode(dealer.recv_multipart())
        assert announce.kind == "weights_announce" and announce.body.version == 1
        asm = WeightsAssembly(announce.body)
        for _ in range(announce.body.num_chunks):
            assert dealer.poll(5000)
            chunk = decode(dealer.recv_multipart())
            asm.add(chunk.body.index, chunk.arrays["bytes"])
        assert torch.equal(asm.state()["w"], torch.arange(6, dtype=torch.float32))
        assert server.server.rejected == {"undecodable": 1, "unexpected": 1}
    finally:
        dealer.close(0)
        server.close()


def test_a_part_that_fails_its_checksum_is_counted_and_fetched_again(context: zmq.Context) -> None:
    """A server (by hand) whose first copy of v1 has one bit flipped: the edge applies nothing of
    it, counts it, asks again soon (not after `resend_s`) holding none of it, and applies the good copy."""
    packed = pack(1, actor_state(), chunk_bytes=64)
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:0")
    receiver = WeightReceiver(context, router.getsockopt_string(zmq.LAST_ENDPOINT), resend_s=10.0)

    def serve(flip: bool) -> pb.WeightsRequest:
        assert router.poll(8000), "no request from the edge"
        identity, *frames = router.recv_multipart()
        router.send_multipart([identity, *encode(envelope(weights_announce=packed.announce))])
        for index, chunk in enumerate(packed.chunks):
            data = np.frombuffer(bytes(chunk), np.uint8).copy()
            if flip and index == 1:
                data[3] ^= 1
            head = envelope(weights_chunk=pb.WeightsChunk(version=1, index=index))
            router.send_multipart([identity, *encode(head, {"bytes": data})])
        return decode(frames).body

    try:
        assert serve(flip=True).have_version == -1
        start = time.monotonic()
        again = serve(flip=False)
        assert time.monotonic() - start < 5.0  # asked again at once, not after resend_s
        assert again.have_version == -1 and len(again.held) == 0  # nothing of the bad copy kept
        version, state = receiver.wait_for(1, timeout=5.0)
        assert version == 1 and all(torch.equal(state[n], t) for n, t in actor_state().items())
        assert receiver.checksum_failures == 1 and receiver.completed == 1
    finally:
        receiver.close()
        router.close(0)
