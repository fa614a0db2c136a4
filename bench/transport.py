"""Edge -> learner transport of 84x84x3 image transitions, three ways, in one run:

- ours: the full path. Transitions are batched as the edge daemon batches them (uint8 images; the
  next observation is the next row; `fleet.batch_transitions` steps a message, 64 by default, an
  episode's end inside a batch with its final observation; and, as the daemon's BacklogAdapter does
  while the backlog of unacked batches is high, up to 4x as many a message: a robot stepping flat
  out against one learner has that backlog). The edge's `DataLink` spools each batch to disk and
  sends it as a protobuf envelope plus raw frames; the learner's `Ingest` decodes and validates it,
  appends it to the durable replay buffer (segments on disk, group commits, SQLite index) and
  acknowledges it once durable. Timed until the edge holds the last ack. The steps themselves are
  made before the clock starts, as a robot's are; taking each batch out of them (a copy, as
  `BatchBuilder.take_batch` makes) is timed.
- plain: pyzmq PUSH/PULL of exactly the bytes our batches carried, message for message (no
  envelope, no validation, no disk, no acks): the raw baseline.
- torch.save over gRPC: a re-implementation of the style of LeRobot's actor/learner (lerobot
  0.4 `transport/`): the actor collects a whole episode of transitions (observation and next
  observation, float32 images), `torch.save`s the list, streams the bytes in 2 MiB chunks
  (begin / middle / end) over a client-streaming gRPC call; the learner reassembles them,
  `torch.load`s the list and appends each transition to an in-memory list. Timed until the
  learner has loaded the last episode.

Sender and receiver are separate processes; each figure is the median of `--repeats` runs, and
each ratio is against the plain copy (and ours against gRPC) measured in the same run. Ours and
plain move `--transitions` (20,000: 0.4 GiB, a second or more of ours, so a connection's start and
the last group commit's wait are a few percent of it, not most of it); gRPC moves at most
`--grpc-transitions` (its learner keeps every float32 transition in a list in RAM: 170 KB each).
For ours, the CPU seconds of each side (all threads: ZeroMQ's I/O thread, the commit thread), user
and system, during the timed part are reported too: where the time goes.

The learner is a fresh process, so its RAM cache is fresh memory: until a learner has taken its
first `buffer.ram_budget_mb` (2 GiB, about 100,000 such transitions), each segment's slot is faulted
in page by page, and on a VM whose host takes back free guest memory (this project's 2-core box)
that is a large part of the learner's cost. `--warm-learner` faults the cache in before the clock:
the steady state of a learner that has run that long.

    python bench/transport.py [--transitions 20000] [--repeats 3] [--warm-learner] [--out transport.json]
    python bench/transport.py --quick                       # 300 transitions, 1 repeat (the test)
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from user_rl.cloud.ingest import Ingest  # noqa: E402
from user_rl.config import FleetConfig  # noqa: E402
from user_rl.edge.adapt import BacklogAdapter  # noqa: E402
from user_rl.edge.batching import BatchBuilder  # noqa: E402
from user_rl.edge.link import DataLink  # noqa: E402
from user_rl.hal.descriptor import DeviceDescriptor  # noqa: E402
from user_rl.wire import user_rl_pb2 as pb  # noqa: E402
from user_rl.wire.transitions import FINAL_OBS, FINAL_ROW  # noqa: E402

IMAGE = (84, 84, 3)
STATE, ACTION = 8, 4
EPISODE = 100  # steps
BATCH = FleetConfig().batch_transitions  # transitions per message of ours: the fleet's default (64)
CHUNK = 2 << 20  # LeRobot's gRPC chunk size (transport/utils.py CHUNK_SIZE)
OBS_SPACE = gym.spaces.Dict(
    {"image": gym.spaces.Box(0, 255, IMAGE, np.uint8), "state": gym.spaces.Box(-1, 1, (STATE,), np.float32)}
)
ACTION_SPACE = gym.spaces.Box(-1, 1, (ACTION,), np.float32)
TRANSFER_BEGIN, TRANSFER_MIDDLE, TRANSFER_END = 1, 2, 3  # LeRobot's TransferState


def observation(t: int) -> dict[str, np.ndarray]:
    """A camera frame and a state vector that change every step (not all-zero pages)."""
    return {"image": np.full(IMAGE, t % 251, np.uint8), "state": np.full(STATE, (t % 100) / 100, np.float32)}


def robot_steps(transitions: int) -> dict[str, np.ndarray]:
    """Every step of a robot, in episodes of EPISODE steps, as one batch's columns (final_row,
    final_obs/...): what `cut` takes batches out of."""
    builder = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=transitions)
    for t in range(transitions):
        step = t % EPISODE
        ends = step == EPISODE - 1 or t == transitions - 1
        builder.add(
            observation(t),
            np.full(ACTION, 0.5, np.float32),
            0.0,
            False,
            ends,
            episode=t // EPISODE,
            step=step,
            policy_version=0,
            actor=pb.ACTOR_POLICY,
            label=pb.LABEL_NONE,
            sensor_time=time.time(),
            final_obs=observation(t + 1) if ends else None,
        )
    return builder.take()[1]


def cut(steps: dict[str, np.ndarray], start: int, end: int) -> tuple[int, dict[str, np.ndarray]]:
    """Steps [start, end) as a batch of fresh arrays, as `BatchBuilder.take` makes them."""
    final_rows = steps[FINAL_ROW]
    mine = (final_rows >= start) & (final_rows < end)
    columns = {}
    for name, values in steps.items():
        if name == FINAL_ROW:
            columns[name] = values[mine] - start
        elif name.startswith(FINAL_OBS):
            columns[name] = values[mine]  # fancy indexing: a copy
        else:
            columns[name] = values[start:end].copy()
    return end - start, columns


def episode_cut_sizes(transitions: int, batch: int) -> list[int]:
    """Batch sizes when a batch also ends with each episode (this bench before: 32, 32, 32, 4, ...)."""
    sizes, count = [], 0
    for t in range(transitions):
        count += 1
        if count == batch or t % EPISODE == EPISODE - 1 or t == transitions - 1:
            sizes.append(count)
            count = 0
    return sizes


def in_batches(steps: dict[str, np.ndarray], sizes: list[int]):
    """(count, columns) of consecutive batches of these sizes."""
    start = 0
    for size in sizes:
        yield cut(steps, start, start + size)
        start += size


def cpu_seconds() -> np.ndarray:
    """[user, system] CPU seconds of this process so far, every thread. System time is the kernel's
    share: copies into the page cache and sockets, and faulting in fresh memory (which varies most
    from run to run on a VM whose host takes back free guest memory)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([usage.ru_utime, usage.ru_stime])


# -- ours ---------------------------------------------------------------------------------------
def ours_learner(buffer_dir: str, ready: mp.Queue, stop: mp.Event, clock: mp.Event, warm: bool = False) -> None:
    import zmq

    context = zmq.Context()
    ingest = Ingest(context, "tcp://127.0.0.1:0", Path(buffer_dir))
    ready.put(ingest.endpoint)
    while warm:  # the hello opens the buffer; then its whole RAM cache is faulted in
        ingest.poll(timeout_ms=5)
        if ingest.buffer is not None:
            cache = ingest.buffer.cache
            for slot in range(cache.slots):
                cache.populate(slot, 0, cache.segment_rows)
            ready.put("warm")
            warm = False
    while not clock.is_set():  # the hello, before the clock starts
        ingest.poll(timeout_ms=5)
    cpu = cpu_seconds()
    while not stop.is_set():
        ingest.poll(timeout_ms=20)
    ready.put((len(ingest.buffer), cpu_seconds() - cpu))
    ingest.close()
    context.term()


def run_ours(
    transitions: int, batch: int = BATCH, sizes: list[int] | None = None, warm: bool = False, **_: object
) -> dict:
    """Ours; `sizes`: these batch sizes, else `batch` at first and then what the daemon's
    BacklogAdapter makes of the backlog after each batch (the sizes used come back). `warm`: the
    learner's RAM cache is faulted in before the clock starts, as a learner's is once it has taken
    its first `buffer.ram_budget_mb` (from then on a new segment reuses a slot)."""
    import zmq

    steps = robot_steps(transitions)  # made before the clock starts, as a robot's steps are
    nbytes = sum(column.nbytes for column in steps.values())
    spawn = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp:
        ready, stop, clock = spawn.Queue(), spawn.Event(), spawn.Event()
        learner = spawn.Process(
            target=ours_learner, args=(os.path.join(tmp, "buffer"), ready, stop, clock, warm), daemon=True
        )
        learner.start()
        endpoint = ready.get(timeout=120)
        context = zmq.Context()
        link = DataLink(context, endpoint, DeviceDescriptor("sim", "bench", "edge-0"), OBS_SPACE, ACTION_SPACE)
        link.hello()
        while not link.welcomed:
            link.poll(20)
        if warm:
            assert ready.get(timeout=600) == "warm"
        adapter = BacklogAdapter(batch, {}, link.settings.max_in_flight)
        used: list[int] = []
        clock.set()
        cpu = cpu_seconds()
        started = time.perf_counter()
        start, size = 0, batch
        while start < transitions:
            if sizes is not None:
                size = sizes[len(used)]
            count, columns = cut(steps, start, min(transitions, start + size))
            link.send_batch(count, columns)
            link.poll(0)
            used.append(count)
            start += count
            size, _ = adapter.update(link.unacked)  # as the daemon's _adapt after each batch
        while link.unacked:
            link.poll(20)
        elapsed = time.perf_counter() - started
        edge_cpu = cpu_seconds() - cpu
        resends = link.resends
        link.close()
        context.term()
        stop.set()
        stored, learner_cpu = ready.get(timeout=120)
        learner.join(60)
    assert stored == transitions, f"the learner stored {stored} of {transitions} transitions"
    return {
        "seconds": elapsed,
        "payload_bytes": nbytes,
        "messages": len(used),
        "sizes": used,
        # to the stop: the last ack's wait counts, little else
        "edge_cpu_s": {"user": round(float(edge_cpu[0]), 3), "system": round(float(edge_cpu[1]), 3)},
        "learner_cpu_s": {"user": round(float(learner_cpu[0]), 3), "system": round(float(learner_cpu[1]), 3)},
        "resends": resends,
    }


# -- plain PUSH/PULL of the same bytes ----------------------------------------------------------
def plain_receiver(expected_bytes: int, ready: mp.Queue, done: mp.Queue) -> None:
    import zmq

    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    ready.put(pull.bind_to_random_port("tcp://127.0.0.1"))
    got = 0
    while got < expected_bytes:
        got += sum(len(frame.buffer) for frame in pull.recv_multipart(copy=False))
    done.put(time.perf_counter())
    pull.close(0)
    context.term()


def run_plain(transitions: int, sizes: list[int], **_: object) -> dict:
    """Plain PUSH/PULL of the batches ours sent (`sizes`), their arrays as they are."""
    import zmq

    batches = list(in_batches(robot_steps(transitions), sizes))
    nbytes = sum(column.nbytes for _, columns in batches for column in columns.values())
    spawn = mp.get_context("spawn")
    ready, done = spawn.Queue(), spawn.Queue()
    receiver = spawn.Process(target=plain_receiver, args=(nbytes, ready, done), daemon=True)
    receiver.start()
    port = ready.get(timeout=120)
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    started = time.perf_counter()
    for _, columns in batches:
        push.send_multipart([np.ascontiguousarray(column) for column in columns.values()], copy=False)
    finished = done.get(timeout=600)
    push.close()
    context.term()
    receiver.join(60)
    return {"seconds": finished - started, "payload_bytes": nbytes}  # perf_counter is system-wide on Linux


# -- torch.save over gRPC, as LeRobot's actor/learner ------------------------------------------
SERVICE, METHOD = "bench.LearnerService", "SendTransitions"


def grpc_learner(ready: mp.Queue, done: mp.Queue, expected: int) -> None:
    import grpc
    import torch

    torch.set_num_threads(1)
    replay: list[dict] = []

    def send_transitions(chunks, context) -> bytes:  # the learner's servicer: reassemble, then load
        buffer = io.BytesIO()
        for chunk in chunks:
            state, data = chunk[0], chunk[1:]
            if state == TRANSFER_BEGIN:
                buffer = io.BytesIO()
            buffer.write(data)
            if state == TRANSFER_END:
                buffer.seek(0)
                replay.extend(torch.load(buffer, weights_only=False))  # LeRobot's bytes_to_transitions
                if len(replay) >= expected:
                    done.put(time.perf_counter())
        return b""

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            METHOD: grpc.stream_unary_rpc_method_handler(
                send_transitions, request_deserializer=lambda b: b, response_serializer=lambda b: b
            )
        },
    )
    options = [("grpc.max_receive_message_length", 4 * CHUNK), ("grpc.max_send_message_length", 4 * CHUNK)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=options)
    server.add_generic_rpc_handlers((handler,))
    ready.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination(timeout=900)


def lerobot_transition(t: int, torch) -> dict:
    """One transition as LeRobot's actor builds it: float32 tensors, the next observation beside it."""

    def state(step: int) -> dict:
        obs = observation(step)
        return {
            "observation.image": torch.from_numpy(obs["image"]).permute(2, 0, 1).float().div(255).unsqueeze(0),
            "observation.state": torch.from_numpy(obs["state"]).unsqueeze(0),
        }

    ends = t % EPISODE == EPISODE - 1
    return {
        "state": state(t),
        "action": torch.full((1, ACTION), 0.5),
        "reward": 0.0,
        "next_state": state(t + 1),
        "done": False,
        "truncated": ends,
        "complementary_info": {},
    }


def episode_chunks(payload: bytes):
    """LeRobot's send_bytes_in_chunks: begin, middle..., end."""
    for offset in range(0, len(payload), CHUNK):
        last = offset + CHUNK >= len(payload)
        state = TRANSFER_END if last else TRANSFER_BEGIN if offset == 0 else TRANSFER_MIDDLE
        yield bytes([state]) + payload[offset : offset + CHUNK]


def run_grpc(transitions: int, **_shape) -> dict:  # LeRobot's actor sends whole episodes
    import grpc
    import torch

    torch.set_num_threads(1)
    spawn = mp.get_context("spawn")
    ready, done = spawn.Queue(), spawn.Queue()
    learner = spawn.Process(target=grpc_learner, args=(ready, done, transitions), daemon=True)
    learner.start()
    port = ready.get(timeout=120)
    options = [("grpc.max_receive_message_length", 4 * CHUNK), ("grpc.max_send_message_length", 4 * CHUNK)]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
    grpc.channel_ready_future(channel).result(timeout=60)
    send = channel.stream_unary(
        f"/{SERVICE}/{METHOD}", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    started = time.perf_counter()
    sent = 0
    for first in range(0, transitions, EPISODE):  # the actor sends each episode when it ends
        episode = [lerobot_transition(t, torch) for t in range(first, min(first + EPISODE, transitions))]
        buffer = io.BytesIO()
        torch.save(episode, buffer)  # LeRobot's transitions_to_bytes
        payload = buffer.getvalue()
        sent += len(payload)
        send(episode_chunks(payload))
    finished = done.get(timeout=900)
    channel.close()
    learner.terminate()
    learner.join(30)
    return {"seconds": finished - started, "payload_bytes": sent}


WAYS = {"ours": run_ours, "plain": run_plain, "grpc_torch_save": run_grpc}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transitions", type=int, default=20000)
    parser.add_argument("--grpc-transitions", type=int, default=3000, help="at most this many for gRPC")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=BATCH, help="transitions a message (fleet.batch_transitions)")
    parser.add_argument("--fixed", action="store_true", help="always --batch a message (no BacklogAdapter)")
    parser.add_argument(
        "--cut-at-episode-end",
        action="store_true",
        help="fixed, and a batch also ends with each episode (this bench before, with --batch 32)",
    )
    parser.add_argument(
        "--warm-learner",
        action="store_true",
        help="fault the learner's RAM cache in before the clock (a learner past its first ram_budget_mb)",
    )
    parser.add_argument("--out", type=str, default=None)
    parser.add_argument("--quick", action="store_true", help="300 transitions, 1 repeat (the test)")
    args = parser.parse_args()
    if args.quick:
        args.transitions, args.repeats = 300, 1
    counts = {way: args.transitions for way in WAYS}
    counts["grpc_torch_save"] = min(args.transitions, args.grpc_transitions)
    if args.cut_at_episode_end:
        shape, fixed = f"{args.batch} a message or to an episode's end", episode_cut_sizes(args.transitions, args.batch)
    elif args.fixed:
        shape = f"{args.batch} a message"
        fixed = [args.batch] * (args.transitions // args.batch) + [args.transitions % args.batch] * bool(
            args.transitions % args.batch
        )
    else:
        shape, fixed = f"{args.batch} a message, up to 4x while the backlog is high (BacklogAdapter)", None
    print(
        f"transport: {args.transitions} transitions of {IMAGE[0]}x{IMAGE[1]}x{IMAGE[2]} images (gRPC: "
        f"{counts['grpc_torch_save']}), {shape}, edge -> learner on loopback, {os.cpu_count()} cores, "
        f"{args.repeats} repeats"
    )
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    for repeat in range(args.repeats):
        sizes = fixed
        for way, run in WAYS.items():
            result = run(counts[way], batch=args.batch, sizes=sizes, warm=args.warm_learner)
            if way == "ours":  # plain sends the very messages ours sent
                sizes = result.pop("sizes")
                result["transitions_a_message"] = {
                    str(size): sizes.count(size) for size in sorted(set(sizes), reverse=True)
                }
            runs[way].append(result)
            cpu = (
                ", CPU s user+system: edge {user:.2f}+{system:.2f}".format(**result["edge_cpu_s"])
                + ", learner {user:.2f}+{system:.2f}".format(**result["learner_cpu_s"])
                if "edge_cpu_s" in result
                else ""
            )
            print(
                f"  repeat {repeat + 1}: {way:16s} {counts[way] / result['seconds']:8.0f} transitions/s "
                f"({result['payload_bytes'] / result['seconds'] / 2**20:7.1f} MiB/s of payload{cpu})",
                flush=True,
            )
    rates = {way: statistics.median(counts[way] / r["seconds"] for r in rs) for way, rs in runs.items()}
    summary = {
        "transitions": args.transitions,
        "transitions_by_way": counts,
        "batch": args.batch,
        "batching": shape,
        "warm_learner": args.warm_learner,
        "image": list(IMAGE),
        "repeats": args.repeats,
        "cores": os.cpu_count(),
        "transitions_per_s": {way: round(rate, 1) for way, rate in rates.items()},
        "payload_bytes_per_transition": {way: round(rs[0]["payload_bytes"] / counts[way]) for way, rs in runs.items()},
        "ours_vs_plain": round(rates["ours"] / rates["plain"], 2),
        "ours_vs_grpc_torch_save": round(rates["ours"] / rates["grpc_torch_save"], 2),
        "runs": runs,
    }
    print(
        f"ours {rates['ours']:.0f} transitions/s: ratio {summary['ours_vs_plain']} to plain PUSH/PULL "
        f"({rates['plain']:.0f}/s), {summary['ours_vs_grpc_torch_save']} to torch.save over gRPC "
        f"({rates['grpc_torch_save']:.0f}/s)"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
