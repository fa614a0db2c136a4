"""With CurveZMQ, another enrolled robot cannot silence a robot's data link: it cannot claim the
robot's old-style routing id (no handover) nor speak for it (its key names another robot)."""

from __future__ import annotations

from pathlib import Path

import zmq

from tests.cloud.test_cloud_ingest import ACTION_SPACE, OBS_SPACE, Episodes, wait_until
from user_rl.cloud.ingest import Ingest
from user_rl.edge.link import DataLink, LinkSettings
from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.security.curve import ClientKeys, Gatekeeper
from user_rl.security.keys import generate
from user_rl.testing.wait import serving
from user_rl.wire.codec import decode, encode, envelope


def test_an_enrolled_robot_cannot_hijack_anothers_link(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate(keys, ["arm-0", "arm-1"])
    context = zmq.Context()
    gate = Gatekeeper(context, keys)
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer", gate=gate)
    link = attacker = None
    try:
        with serving(lambda: ingest.poll(20)) as crashed:
            link = DataLink(
                context,
                ingest.endpoint,
                DeviceDescriptor("sim", "test", "arm-0"),
                OBS_SPACE,
                ACTION_SPACE,
                settings=LinkSettings(curve=ClientKeys.for_robot(keys, "arm-0"), ack_timeout_s=2.0),
            )
            link.hello()
            wait_until(lambda: link.welcomed, timeout=10, pump=lambda: link.poll(20))
            robot = Episodes(40)
            link.send_batch(*robot.batch(10))
            wait_until(lambda: not link.unacked, timeout=10, pump=lambda: link.poll(20))
            # arm-1, enrolled, takes the routing id the old edge chose for arm-0 and replays its hello.
            attacker = context.socket(zmq.DEALER)
            attacker.setsockopt(zmq.LINGER, 0)
            attacker.setsockopt(zmq.ROUTING_ID, f"arm-0:{link.epoch}".encode())
            ClientKeys.for_robot(keys, "arm-1").apply(attacker)
            attacker.connect(ingest.endpoint)
            for _ in range(3):
                attacker.send_multipart(encode(envelope("arm-0", hello=link._hello)))
                assert attacker.poll(5000), "the learner did not answer the attacker"
                reply = decode(attacker.recv_multipart())
                assert reply.kind == "reject" and reply.body.reason.startswith("wrong_robot"), reply
                for _ in range(3):  # the robot streams on, acked within ack_timeout_s + a margin
                    link.send_batch(*robot.batch(10))
                wait_until(
                    lambda: not link.unacked, timeout=link.settings.ack_timeout_s + 5, pump=lambda: link.poll(20)
                )
            assert ingest.robots["arm-0"].stream.durable_seq == link.seq == 10
            assert ingest.robots["arm-0"].transitions == 100
            assert link.rejects == {} and link.reconnects == 0 and "arm-1" not in ingest.robots
            assert ingest.rejected["wrong_robot"] == 3
        assert not crashed, crashed
    finally:
        if link is not None:
            link.close()
        if attacker is not None:
            attacker.close(0)
        ingest.close()
        gate.close()
        context.term()
