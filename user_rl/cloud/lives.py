"""Edge lives as the ingest sees them: the older stream epochs a hello names as still spooled.

Each start of an edge daemon is a new life with a new stream epoch. Its hello names the epochs of
earlier lives whose batches still wait in its spool (oldest first, at most `MAX_SPOOLED_EPOCHS`);
those keep arriving and end with their own `edge_restart` marker, while older epochs it no longer
names have nothing left to send and are ended at the hello (`PersistentReplay.finished_streams`).
Nothing here creates a stream: an epoch that never sent data costs the learner nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import WireError

if TYPE_CHECKING:
    from user_rl.cloud.buffer.writer import BufferWriter

MAX_SPOOLED_EPOCHS = 256  # older epochs one hello may announce (an edge names at most 64)


def spooled_epochs(robot_id: str, hello: pb.Hello) -> list[int]:
    """The older epochs this hello announces, checked before anything is opened."""
    epochs = sorted(set(hello.spooled_epochs))
    if len(epochs) > MAX_SPOOLED_EPOCHS:
        raise WireError("bad_hello", f"{robot_id}: {len(epochs)} spooled epochs, at most {MAX_SPOOLED_EPOCHS}")
    if epochs and epochs[-1] >= hello.stream_epoch:
        raise WireError(
            "bad_hello",
            f"{robot_id}: spooled epoch {epochs[-1]} is not older than the stream epoch {hello.stream_epoch}",
        )
    return epochs


def resume_acks(buffer: BufferWriter, robot_id: str, epochs: list[int], policy_version: int) -> list[pb.Ack]:
    """Where each announced epoch this learner holds data of stands (durable seq, where to resume),
    loading none of them. An epoch it never stored (a life that started and died while it was down,
    or a name a hostile peer made up) gets no ack: the edge sends from its first spooled batch, and
    a gap ack answers that if earlier ones are missing. One index query, O(len(epochs))."""
    return [
        pb.Ack(stream_epoch=epoch, seq=durable, next_seq=last + 1, policy_version=policy_version)
        for epoch, (durable, last) in buffer.stream_positions(robot_id, epochs).items()
        if last
    ]
