"""Weight sync for large models: an edge that joins late or whose link drops mid-transfer ends on
the newest version without fetching twice what it already holds, and once an edge holds the frozen
backbone, a new version moves only the trainable bytes. Real sockets, a real TCP link that drops."""

from __future__ import annotations

import pytest
import torch
import zmq

from tests.support.weight_server import ServerThread
from user_rl.cloud.actor_buffers import ActorBuffers
from user_rl.edge.weights import WeightReceiver
from user_rl.testing.fault_proxy import FaultProxy
from user_rl.testing.wait import wait_until
from user_rl.wire.weights import pack

MIB = 1 << 20
FROZEN = ["backbone.weight"]


def model_state(seed: int) -> dict[str, torch.Tensor]:
    """4 MiB of trainable head (changes each version) and 4 MiB of frozen backbone (never changes)."""
    head = torch.Generator().manual_seed(seed)
    return {
        "head.weight": torch.randn(1024, 1024, generator=head),
        "backbone.weight": torch.randn(1024, 1024, generator=torch.Generator().manual_seed(1234)),
    }


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.term()


def held_chunks(receiver: WeightReceiver) -> int:
    return sum(len(part.held) for part in (receiver._own, receiver._base) if part is not None)


def assert_equal_state(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_an_edge_whose_link_drops_mid_transfer_fetches_only_what_it_lacks(context) -> None:
    server = ServerThread(context)
    v1 = model_state(1)
    server.publish(1, pack(1, v1, frozen=FROZEN))
    total = 8 * MIB
    with FaultProxy(server.endpoint, bandwidth_bps=16e6) as link:  # 2 MB/s: ~4 s for the version
        receiver = WeightReceiver(context, link.address, resend_s=1.0)
        try:
            wait_until(lambda: held_chunks(receiver) >= 3, 20, "three chunks of eight")
            link.drop(1.0)  # the link resets; the chunks in flight are lost
            held = held_chunks(receiver)
            assert 3 <= held < 8
            version, state = receiver.wait_for(1, timeout=30)
            assert version == 1
            assert_equal_state(state, v1)
            print(
                f"held {held} of 8 chunks when the link dropped; resumed {receiver.resumed}x; "
                f"received {receiver.received_bytes / MIB:.1f} MiB, "
                f"the server sent {server.server.sent_bytes / MIB:.1f} MiB"
            )
            assert link.drops == 1 and receiver.resumed >= 1
            assert receiver.duplicate_chunks == 0  # nothing it held came again
            assert receiver.received_bytes == total  # every byte once
            assert server.server.sent_bytes < total + (8 - held) * MIB + 1  # after the drop: only what it lacked
        finally:
            receiver.close()
    server.close()


def test_an_edge_cut_off_while_a_newer_version_comes_ends_on_it_keeping_the_backbone_it_has(context) -> None:
    server = ServerThread(context)
    server.publish(1, pack(1, model_state(1), frozen=FROZEN))
    with FaultProxy(server.endpoint, bandwidth_bps=16e6) as link:
        receiver = WeightReceiver(context, link.address, resend_s=1.0)
        try:
            # The version's own 4 MiB come first, then the backbone's: cut once part of the backbone is in.
            wait_until(
                lambda: receiver._base is not None and len(receiver._base.held) >= 1,
                20,
                "a first chunk of the backbone",
            )
            link.drop(3.0)
            base_held = len(receiver._base.held)
            v2 = model_state(2)
            server.publish(2, pack(2, v2, frozen=FROZEN))  # while the edge is cut off
            version, state = receiver.wait_for(1, timeout=30)
            assert version == 2  # the newest, not the one it was collecting
            assert_equal_state(state, v2)
            print(
                f"held {base_held} of 4 backbone chunks when cut off; received {receiver.received_bytes / MIB:.1f} MiB"
            )
            assert receiver.duplicate_chunks == 0
            # v1's head (4 MiB), the backbone once (4 MiB), v2's head (4 MiB): not a byte more.
            assert receiver.received_bytes == 12 * MIB
            assert 1 <= base_held < 4
        finally:
            receiver.close()
    server.close()


def test_a_late_edge_gets_the_newest_and_then_only_the_trainable_bytes_of_a_frozen_backbone_vla(context) -> None:
    """The learner's own path: the trainer writes a VLA with a frozen vision encoder into shared
    buffers, the server serves them as they are and hands each buffer back once replaced."""
    from user_rl.hal.registry import make_robot
    from user_rl.policies import make_actor

    robot = make_robot(
        "mujoco_reach", robot_id="probe", obs_mode="image", image_size=32, camera="top", targets="two_colours"
    )
    actor = make_actor("vla", robot.observation_space, robot.action_space, chunk=5, size="tiny", freeze=["encoder"])
    robot.close()
    buffers = ActorBuffers(actor, torch.bfloat16)
    trainable, frozen = buffers.own_layout.total_bytes, buffers.base_layout.total_bytes
    print(f"tiny VLA in bfloat16: {trainable:,} trainable bytes, {frozen:,} frozen")
    assert frozen > 0 and trainable > 0

    server = ServerThread(context)
    receiver = None
    try:
        for version in (1, 2, 3):
            with torch.no_grad():
                for p in actor.parameters():
                    if p.requires_grad:
                        p.add_(0.01)
            server.publish(version, buffers.packed(buffers.write(actor)))
        wait_until(lambda: buffers.free == 2, 5, "the replaced buffers to be handed back")
        receiver = WeightReceiver(context, server.endpoint)
        version, state = receiver.wait_for(0, timeout=10)
        assert version == 3  # the late edge fetches the newest only
        want = actor.state_dict()
        for name, tensor in want.items():
            assert torch.equal(state[name], tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor), name
        assert receiver.received_bytes == trainable + frozen

        before_edge, before_server = receiver.received_bytes, server.server.sent_bytes
        server.publish(4, buffers.packed(buffers.write(actor)))
        version, state = receiver.wait_for(4, timeout=10)
        assert version == 4
        assert receiver.received_bytes - before_edge == trainable  # the backbone stayed where it was
        assert server.server.sent_bytes - before_server == trainable
        for name in want:
            assert name in state
    finally:
        if receiver is not None:
            receiver.close()
        server.close()


def test_a_new_version_reuses_only_memory_no_policy_still_holds(context) -> None:
    """The receiver assembles into an earlier version's buffer (no page faults) only once every tensor
    of that version is gone: a policy still holding version 1 never sees it overwritten."""
    server = ServerThread(context)
    receiver = WeightReceiver(context, server.endpoint)
    storage = lambda state: state["head.weight"].untyped_storage().data_ptr()  # noqa: E731
    try:
        states = {v: model_state(v) for v in (1, 2, 3, 4)}
        server.publish(1, pack(1, states[1], frozen=FROZEN))
        _, held = receiver.wait_for(1, timeout=10)  # kept, as a policy that has not loaded it yet would
        server.publish(2, pack(2, states[2], frozen=FROZEN))
        _, second = receiver.wait_for(2, timeout=10)
        second_memory = storage(second)
        del second  # loaded and dropped
        server.publish(3, pack(3, states[3], frozen=FROZEN))
        _, third = receiver.wait_for(3, timeout=10)
        assert storage(third) == second_memory  # the free buffer, not the held one
        assert storage(third) != storage(held)
        assert_equal_state(held, states[1])  # untouched
        assert_equal_state(third, states[3])
        del third
        server.publish(4, pack(4, states[4], frozen=FROZEN))
        _, fourth = receiver.wait_for(4, timeout=10)
        assert storage(fourth) == second_memory
        assert_equal_state(held, states[1])
    finally:
        receiver.close()
        server.close()


class Policy(torch.nn.Module):
    """An edge's policy with the test model's tensors (float32 on the CPU, as the versions arrive)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(1024, 1024, bias=False)
        self.backbone = torch.nn.Linear(1024, 1024, bias=False)


def test_a_policy_takes_a_received_version_without_a_copy_and_its_memory_is_never_overwritten(context) -> None:
    """A version that fits the policy (dtype, shape, device) becomes the policy's own tensors; the
    receiver lands the next versions elsewhere until the policy has moved on from it."""
    from user_rl.policies.weights import load_received

    server = ServerThread(context)
    receiver = WeightReceiver(context, server.endpoint)
    policy = Policy()
    try:
        states = {v: model_state(v) for v in (1, 2, 3, 4)}
        server.publish(1, pack(1, states[1], frozen=FROZEN))
        _, state = receiver.wait_for(1, timeout=10)
        assert load_received(policy, state)  # taken as they are: no copy
        assert policy.head.weight.data_ptr() == state["head.weight"].data_ptr()
        del state
        for version in (2, 3):  # they land while the policy still acts with version 1
            server.publish(version, pack(version, states[version], frozen=FROZEN))
            _, state = receiver.wait_for(version, timeout=10)
            assert state["head.weight"].data_ptr() != policy.head.weight.data_ptr()
            del state
        assert_equal_state(dict(policy.state_dict()), states[1])  # untouched by versions 2 and 3
        server.publish(4, pack(4, states[4], frozen=FROZEN))
        _, state = receiver.wait_for(4, timeout=10)
        assert load_received(policy, state)
        del state
        assert_equal_state(dict(policy.state_dict()), states[4])
        # A version that does not fit (here: cast to bfloat16 for a float32 policy) is loaded by copy.
        server.publish(5, pack(5, states[1], cast_floats_to=torch.bfloat16, frozen=FROZEN))
        _, state = receiver.wait_for(5, timeout=10)
        assert not load_received(policy, state)
        assert policy.head.weight.dtype == torch.float32
        assert policy.head.weight.data_ptr() != state["head.weight"].data_ptr()
        torch.testing.assert_close(policy.head.weight, states[1]["head.weight"], atol=0.02, rtol=0.01)
    finally:
        receiver.close()
        server.close()
