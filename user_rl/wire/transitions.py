"""The transition columns: their names and types, one place for every layer that handles them. The
edge fills them in batches, the ingest checks them (`validate_batch`), the buffer lays them out as
rows, the trainer receives them in sampled batches, the dataset export renames them.

A batch is a run of consecutive steps of one robot. Record t holds obs_t, the action executed
at t and what followed (reward, terminated, truncated). Its next observation is the obs of
record t+1 of the same episode, or, when the episode ends at t, `final_obs/<key>` at the row
listed in `final_row`. Next observations never cross episodes or robots.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import WireError

OBS = "obs/"
FINAL_OBS = "final_obs/"
NEXT_OBS = "next_" + OBS  # a sampled batch's next observations (never on the wire: the buffer links rows)
FINAL_ROW = "final_row"
POLICY_ACTION = "policy_action"

# Per-row scalar columns and their dtypes.
MAX_INDEX_INT = 2**63 - 1  # the largest id the buffer's SQLite index can hold
SCALAR_COLUMNS: dict[str, np.dtype] = {
    "reward": np.dtype(np.float32),
    "terminated": np.dtype(np.bool_),
    "truncated": np.dtype(np.bool_),
    "episode": np.dtype(np.uint64),
    "step": np.dtype(np.int64),
    "policy_version": np.dtype(np.int64),
    "actor": np.dtype(np.uint8),
    "label": np.dtype(np.uint8),
    "sensor_time": np.dtype(np.float64),
}

# Rows where someone acted instead of the policy: a person, or the scripted intervener that stands
# in for one in simulation. Sampling (the "intervention" source), eviction and `inspect` count
# these; warm-up's random actions are online data.
INTERVENTION_ACTORS = (pb.ACTOR_HUMAN, pb.ACTOR_SCRIPTED)


def intervened(actor: np.ndarray) -> np.ndarray:
    """Per row of an `actor` column: True where the step was an intervention."""
    actor = np.asarray(actor)
    # Two comparisons, not np.isin: isin sorts and costs ~50 us on a batch's few dozen rows, and the
    # ingest asks several times per batch.
    return (actor == INTERVENTION_ACTORS[0]) | (actor == INTERVENTION_ACTORS[1])


# Per-row columns an edge may leave out (older edges): the learner stores 0 for them.
OPTIONAL_COLUMNS: dict[str, np.dtype] = {
    "label_by": np.dtype(np.uint8),  # LabelBy enum: who gave the row's label
    "chunk_step": np.dtype(np.uint8),  # the policy's proposal is action chunk_step of its chunk (0: a new chunk)
    "idle": np.dtype(np.bool_),  # a person drove and held nothing: the robot held still (see IDLE)
    "actor_person": np.dtype(np.uint16),  # which person acted, by name (see PEOPLE)
    "label_person": np.dtype(np.uint16),  # which person gave the row's label, by name (see PEOPLE)
}
# IDLE marks a step on which a person drove but held nothing (no key, stick or button: the teleop
# page's source knows), so the robot only held still. Such rows are not demonstrations: the buffer
# draws them as `buffer.idle_rows` says (set by `teleop.idle_rows`: keep, downweight, drop).
# A flag column beside `actor`, rather than a new Actor value: the row still says truthfully who
# had the robot (a person: interventions, take-over counts, exports and eviction stay as they
# are), an optional column travels with no schema change on the wire (an edge that does not send it
# sends no idle rows), and a segment written before it existed reads it as False
# (`rows.DEFAULTED_COLUMNS`), so old buffers open and continue unchanged.
IDLE = "idle"

# PEOPLE: which person acted on a row (`actor_person`: the teleop page's driver, a LeRobot
# teleoperator by its source name; 0 for the policy, warm-up and the scripted intervener) and which
# person labelled it (`label_person`: a mark's `by`; 0 for the env's and a classifier's labels). Two
# small integer columns, 0 = nobody named, 1 + i = the batch's `people[i]` (`TransitionBatch.people`,
# a list of names beside the frames), rather than a string per row: a row stays fixed-size numbers
# like every other column (segments, the RAM cache and a LeRobot export hold no strings), a batch
# names each person once, and an edge or buffer from before the columns reads as nobody named. The
# buffer maps a batch's names to run-wide ids in its index (`buffer/people.py`), durably before the
# rows that use them are written, so a crash never leaves an id without its name. Names come from a
# page (untrusted): each is cut to MAX_PERSON_CHARS printable characters (`person_name`, as the
# teleop page's hello name is), a batch names at most MAX_BATCH_PEOPLE, a buffer keeps at most
# `buffer/people.MAX_PEOPLE`; beyond either, rows read as nobody named.
ACTOR_PERSON, LABEL_PERSON = "actor_person", "label_person"
PERSON_COLUMNS = (ACTOR_PERSON, LABEL_PERSON)
MAX_PERSON_CHARS = 40
MAX_BATCH_PEOPLE = 32


def person_name(text: str) -> str:
    """A name as rows record it: stripped, unprintable characters as "?", at most MAX_PERSON_CHARS."""
    name = "".join(c if c.isprintable() else "?" for c in str(text).strip()[:MAX_PERSON_CHARS])
    return name.strip()


def check_people(arrays: dict[str, np.ndarray], people: Sequence[str]) -> None:
    """Raise `WireError` unless `people` is a bounded list of distinct names as `person_name` makes
    them, and every id in the person columns names one of them (or is 0: nobody)."""
    if len(people) > MAX_BATCH_PEOPLE:
        raise WireError("bad_people", f"{len(people)} names in one batch (at most {MAX_BATCH_PEOPLE})")
    for name in people:
        if not name or name != person_name(name):
            raise WireError("bad_people", f"name {name[:MAX_PERSON_CHARS]!r} is empty, too long or unprintable")
    if len(set(people)) != len(people):
        raise WireError("bad_people", "a name is listed twice")
    for column in PERSON_COLUMNS:
        ids = arrays.get(column)
        if ids is not None and len(ids) and int(ids.max()) > len(people):
            raise WireError("bad_people", f"{column} {int(ids.max())} names nobody ({len(people)} names sent)")


MAX_BATCH_ROWS = 65536
# The end_reason of an episode a person discarded (LeRobot's re-record): the buffer keeps its rows
# but never samples them.
DISCARD = "discard"
# The end_reason of the episode an edge life was in when it died: the next life of the edge writes
# it as the last batch of the dead life's spooled epoch, so it ends that epoch after all its data.
EDGE_RESTART = "edge_restart"


def _check(name: str, array: np.ndarray | None, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if array is None:
        raise WireError("missing_column", name)
    if array.dtype != dtype:
        raise WireError("bad_dtype", f"{name}: {array.dtype}, expected {dtype}")
    if array.shape != shape:
        raise WireError("bad_shape", f"{name}: {list(array.shape)}, expected {list(shape)}")
    return array


def validate_batch(
    arrays: dict[str, np.ndarray],
    count: int,
    obs_space: gym.spaces.Dict,
    action_space: gym.spaces.Box,
    people: Sequence[str] = (),
) -> None:
    """Raise `WireError` unless the columns form `count` well-typed rows for these spaces, whose
    person columns name only `people` (the batch's names)."""
    if not 0 < count <= MAX_BATCH_ROWS:
        raise WireError("bad_count", f"{count} rows")
    expected = set(SCALAR_COLUMNS) | set(OPTIONAL_COLUMNS) | {"action", FINAL_ROW, POLICY_ACTION}
    expected |= {OBS + k for k in obs_space.spaces} | {FINAL_OBS + k for k in obs_space.spaces}
    unknown = sorted(set(arrays) - expected)
    if unknown:
        raise WireError("unknown_column", unknown[0])
    for name, dtype in SCALAR_COLUMNS.items():
        _check(name, arrays.get(name), dtype, (count,))
    for name, dtype in OPTIONAL_COLUMNS.items():
        if name in arrays:
            _check(name, arrays[name], dtype, (count,))
    check_people(arrays, people)
    if (arrays["episode"] > MAX_INDEX_INT).any():  # episodes are indexed in SQLite (signed 64-bit)
        raise WireError("bad_episode", "episode numbers must be below 2**63")
    for name in ("action", POLICY_ACTION):
        if name == "action" or name in arrays:
            action = _check(name, arrays.get(name), action_space.dtype, (count, *action_space.shape))
            if not np.isfinite(action).all():
                raise WireError("non_finite", f"{name} holds NaN or inf")
    # What the robot applied lies in its action space (drivers and the safety filter clip to it).
    if ((arrays["action"] < action_space.low) | (arrays["action"] > action_space.high)).any():
        raise WireError("out_of_bounds", "action outside the declared action space")
    if not np.isfinite(arrays["reward"]).all():
        raise WireError("non_finite", "reward holds NaN or inf")
    ended = np.flatnonzero(arrays["terminated"] | arrays["truncated"])
    final_row = _check(FINAL_ROW, arrays.get(FINAL_ROW, np.zeros(0, np.int64)), np.dtype(np.int64), (len(ended),))
    if not np.array_equal(final_row, ended):
        raise WireError("bad_final_rows", "final_row must list exactly the rows whose episode ends")
    for key, space in obs_space.spaces.items():
        obs = _check(OBS + key, arrays.get(OBS + key), space.dtype, (count, *space.shape))
        if obs.dtype.kind == "f" and not np.isfinite(obs).all():
            raise WireError("non_finite", f"{OBS + key} holds NaN or inf")
        if len(ended) or FINAL_OBS + key in arrays:
            final = _check(FINAL_OBS + key, arrays.get(FINAL_OBS + key), space.dtype, (len(ended), *space.shape))
            if final.dtype.kind == "f" and not np.isfinite(final).all():  # it becomes a next observation
                raise WireError("non_finite", f"{FINAL_OBS + key} holds NaN or inf")
