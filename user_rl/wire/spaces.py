"""Spaces and descriptors on the wire: what an edge tells the learner in its hello, and the same
spaces as text, which the buffer's metadata, checkpoints and dataset exports keep."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from user_rl.hal.descriptor import DeviceDescriptor
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import MAX_DIMS, WIRE_DTYPES, WireError

MAX_SPACE_ELEMENTS = 1 << 24  # per observation entry or action (a 2048 x 2048 x 4 image)
MAX_OBSERVATION_KEYS = 64
MAX_NAME_CHARS = 128  # observation keys, robot ids
MAX_TEXT_CHARS = 4096  # instructions and other free text in a hello


def box_to_proto(space: gym.spaces.Box) -> pb.BoxSpace:
    low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
    uniform = low.size and np.all(low == low.flat[0]) and np.all(high == high.flat[0])
    return pb.BoxSpace(
        dtype=space.dtype.name,
        shape=space.shape,
        low=[low.flat[0]] if uniform else low.ravel().tolist(),
        high=[high.flat[0]] if uniform else high.ravel().tolist(),
    )


def check_box(msg: pb.BoxSpace) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of a peer's declared space, checked without allocating anything the size of
    the space (ValueError): only the bounds the message itself carries are looked at."""
    shape = tuple(int(d) for d in msg.shape)
    if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
        raise ValueError(f"shape {list(shape)}: at most {MAX_DIMS} dimensions, none negative")
    elements = int(np.prod(shape, dtype=np.float64))
    if elements > MAX_SPACE_ELEMENTS:
        raise ValueError(f"shape {list(shape)} has {elements:,} elements (at most {MAX_SPACE_ELEMENTS:,})")
    if msg.dtype not in WIRE_DTYPES:
        raise ValueError(f"dtype {msg.dtype!r} is not allowed on the wire")
    if len(msg.low) != len(msg.high) or len(msg.low) not in (1, elements):
        raise ValueError(f"bounds: {len(msg.low)} low and {len(msg.high)} high values for {elements} elements")
    low, high = np.asarray(msg.low, np.float64), np.asarray(msg.high, np.float64)  # the message's own size
    if np.isnan(low).any() or np.isnan(high).any() or (low > high).any():
        raise ValueError("bounds: NaN, or a low bound above its high bound")
    return shape, np.dtype(msg.dtype)


def box_from_proto(msg: pb.BoxSpace) -> gym.spaces.Box:
    """A peer's declared space, checked before anything the size of it is allocated (ValueError).
    Building it costs about 4 bytes per byte of one observation (bounds, and gymnasium's masks)."""
    shape, dtype = check_box(msg)
    if len(msg.low) == 1:  # uniform bounds: cast the scalar once, fill in the space's own dtype
        low = np.full(shape, np.asarray(msg.low[0], np.float64).astype(dtype), dtype)
        high = np.full(shape, np.asarray(msg.high[0], np.float64).astype(dtype), dtype)
    else:
        low = np.asarray(msg.low, np.float64).reshape(shape).astype(dtype)
        high = np.asarray(msg.high, np.float64).reshape(shape).astype(dtype)
    return gym.spaces.Box(low, high, shape, dtype)


def box_differs(msg: pb.BoxSpace, known: gym.spaces.Box) -> str | None:
    """How a declared space differs from a known one, or None. Dtype and shape first; then the
    bounds, cast to the space's dtype as `box_from_proto` would, compared element by element
    with the known ones in place: no space is built, the cost is bounded by the known space."""
    shape, dtype = check_box(msg)
    if dtype != known.dtype:
        return f"dtype {dtype.name}, expected {known.dtype.name}"
    if shape != known.shape:
        return f"shape {list(shape)}, expected {list(known.shape)}"
    for side, declared, bound in (("low", msg.low, known.low), ("high", msg.high, known.high)):
        values = np.asarray(declared, np.float64).astype(dtype)  # 1 value (uniform) or the message's own
        same = bool((bound == values[0]).all()) if len(values) == 1 else np.array_equal(bound, values.reshape(shape))
        if not same:
            return f"{side} bounds differ from the fleet's"
    return None


def dict_space_to_proto(space: gym.spaces.Dict) -> dict[str, pb.BoxSpace]:
    return {key: box_to_proto(sub) for key, sub in space.spaces.items()}


def check_dict_space(entries) -> None:
    """The observation entries' count and names (ValueError)."""
    if not 0 < len(entries) <= MAX_OBSERVATION_KEYS:
        raise ValueError(f"{len(entries)} observation keys (1 to {MAX_OBSERVATION_KEYS})")
    for key in entries:
        if not key or len(key) > MAX_NAME_CHARS or not key.isprintable():
            raise ValueError(f"observation key {key[:MAX_NAME_CHARS]!r} is empty, too long or unprintable")


def dict_space_from_proto(entries) -> gym.spaces.Dict:
    check_dict_space(entries)
    return gym.spaces.Dict({key: box_from_proto(entries[key]) for key in sorted(entries)})


def spaces_differ(entries, action: pb.BoxSpace, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> str | None:
    """How a hello's declared spaces differ from the known ones, or None, without building any
    declared space bigger than its known counterpart (ValueError: the declaration is unusable)."""
    check_dict_space(entries)
    known = obs_space.spaces
    if set(entries) != set(known):
        extra, missing = sorted(set(entries) - set(known)), sorted(set(known) - set(entries))
        return f"observation keys: unexpected {extra[:4]}, missing {missing[:4]}"
    for key in sorted(entries):
        problem = box_differs(entries[key], known[key])
        if problem:
            return f"observation {key!r}: {problem}"
    problem = box_differs(action, action_space)
    return f"action: {problem}" if problem else None


def declared_step_bytes(entries, action: pb.BoxSpace) -> int:
    """Bytes of one observation plus one action as declared (checked first, nothing allocated)."""
    check_dict_space(entries)
    total = 0
    for msg in [*entries.values(), action]:
        shape, dtype = check_box(msg)
        total += int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    return total


def descriptor_to_proto(d: DeviceDescriptor) -> pb.Descriptor:
    return pb.Descriptor(
        kind=d.kind,
        model=d.model,
        id=d.id,
        control_hz=d.control_hz,
        instruction=d.instruction,
        cameras=list(d.cameras),
    )


def descriptor_from_proto(msg: pb.Descriptor) -> DeviceDescriptor:
    return DeviceDescriptor(
        kind=msg.kind,
        model=msg.model,
        id=msg.id,
        control_hz=msg.control_hz,  # type: ignore[arg-type]
        instruction=msg.instruction,
        cameras=tuple(msg.cameras),
    )


def hello_spaces(
    robot_id: str,
    hello: pb.Hello,
    obs_space: gym.spaces.Dict | None,
    action_space: gym.spaces.Box | None,
    max_message_bytes: int,
) -> tuple[gym.spaces.Dict, gym.spaces.Box] | None:
    """Check a hello's declared spaces against the fleet's (`obs_space`, `action_space`) before building
    anything their size: None when they match; for a fleet without spaces yet, the spaces to open the
    buffer with, if one step and its final observation fit in one message. WireError otherwise."""
    try:
        if obs_space is not None:
            problem = spaces_differ(hello.observation_space, hello.action_space, obs_space, action_space)
        else:
            problem, step_bytes = None, declared_step_bytes(hello.observation_space, hello.action_space)
    except (TypeError, ValueError) as exc:  # bad dtype name, bounds that do not fit the shape
        raise WireError("bad_hello", f"{robot_id}: unusable spaces: {exc}"[:300]) from None
    if problem:
        raise WireError(
            "spaces_mismatch",
            f"{robot_id}: spaces differ from the fleet's: {problem} "
            "(heterogeneous fleets need per-embodiment policies)"[:400],
        )
    if obs_space is not None:
        return None
    if 2 * step_bytes > max_message_bytes:  # a step and its final observation: one message
        raise WireError(
            "bad_hello",
            f"{robot_id}: the declared spaces take {step_bytes / 2**20:.1f} MiB per step; "
            "a step with its final observation must fit in one message of "
            f"{max_message_bytes / 2**20:g} MiB (learner.max_message_mb)",
        )
    try:
        return dict_space_from_proto(hello.observation_space), box_from_proto(hello.action_space)
    except (TypeError, ValueError) as exc:
        raise WireError("bad_hello", f"{robot_id}: unusable spaces: {exc}"[:300]) from None


def spaces_to_text(obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> dict[str, str]:
    """The spaces as text; the same spaces always give the same text (map entries sorted by key)."""
    hello = pb.Hello(observation_space=dict_space_to_proto(obs_space), action_space=box_to_proto(action_space))
    return {"hello_hex": hello.SerializeToString(deterministic=True).hex()}


def spaces_from_text(text: dict[str, str]) -> tuple[gym.spaces.Dict, gym.spaces.Box]:
    hello = pb.Hello.FromString(bytes.fromhex(text["hello_hex"]))
    return dict_space_from_proto(hello.observation_space), box_from_proto(hello.action_space)


def same_spaces(text: dict[str, str], obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> bool:
    """Whether `text` describes these spaces (text written before it was canonical may order keys otherwise)."""
    return spaces_to_text(*spaces_from_text(text)) == spaces_to_text(obs_space, action_space)


def space_differences(
    theirs: tuple[gym.spaces.Dict, gym.spaces.Box], ours: tuple[gym.spaces.Dict, gym.spaces.Box]
) -> tuple[list[str], list[str]]:
    """How spaces `theirs` differ from `ours`: (differences of layout: keys, shapes and dtypes, which
    make rows unreadable; differences of bounds alone), each a sentence naming the key."""
    layout, bounds = [], []
    (their_obs, their_action), (our_obs, our_action) = theirs, ours
    for key in sorted(set(their_obs.spaces) - set(our_obs.spaces)):
        layout.append(f"observation {key!r} is there and not here")
    for key in sorted(set(our_obs.spaces) - set(their_obs.spaces)):
        layout.append(f"observation {key!r} is here and not there")
    shared = sorted(set(their_obs.spaces) & set(our_obs.spaces))
    pairs = [(f"observation {key!r}", their_obs[key], our_obs[key]) for key in shared]
    for name, there, here in [*pairs, ("the action", their_action, our_action)]:
        if there.shape != here.shape or there.dtype != here.dtype:
            layout.append(f"{name} is {there.dtype}{list(there.shape)} there and {here.dtype}{list(here.shape)} here")
        elif not (np.array_equal(there.low, here.low) and np.array_equal(there.high, here.high)):
            there_span = f"[{_span(there.low)}, {_span(there.high)}]"
            bounds.append(f"{name}: {there_span} there, [{_span(here.low)}, {_span(here.high)}] here")
    return layout, bounds


def _span(bound: np.ndarray) -> str:
    """A bound as a person reads it: one number when every element has it, else the elements (or their range)."""
    values = np.ravel(bound)
    if len(np.unique(values)) == 1:
        return f"{values[0]:g}"
    if len(values) > 8:
        return f"{values.min():g}..{values.max():g}"
    return "(" + ", ".join(f"{v:g}" for v in values) + ")"
