"""Lay a robot's batch of step records out as segment rows, linking each row to its successor.

A segment stores rows, not (obs, next_obs) pairs, so images are written once. Three kinds:
a step *record*; the *final* observation of an episode that ended (only its observation
matters); and a *carry*, a copy of a stream's last record from an older segment whose
successor arrived after that segment was sealed. `prev_row` links a row to the row whose
next observation it is, always inside the same segment, so every segment is self-contained
and a transition never pairs states of different episodes or robots: a row gets a successor
only when the same stream continues the same episode at the next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import gymnasium as gym
import numpy as np

from user_rl.cloud.buffer.index import EpisodeRecord, StreamRecord
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import (
    FINAL_OBS,
    FINAL_ROW,
    OBS,
    OPTIONAL_COLUMNS,
    POLICY_ACTION,
    SCALAR_COLUMNS,
    intervened,
)

KIND_RECORD, KIND_FINAL, KIND_CARRY = 0, 1, 2
ROW_COLUMNS: dict[str, np.dtype] = {
    **SCALAR_COLUMNS,
    **OPTIONAL_COLUMNS,
    "stream": np.dtype(np.int32),
    "kind": np.dtype(np.uint8),
    "prev_row": np.dtype(np.int32),
    "task": np.dtype(np.int32),
    "policy_lag": np.dtype(np.int32),  # versions published after the acting one when the row arrived (staleness.py)
}
# Columns a row may lack: the wire's optional ones, and the lag (segments written before it existed).
# They read as 0.
DEFAULTED_COLUMNS: dict[str, np.dtype] = {**OPTIONAL_COLUMNS, "policy_lag": ROW_COLUMNS["policy_lag"]}
Columns = dict[str, np.ndarray]


def segment_schema(obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> dict[str, tuple[np.dtype, tuple]]:
    """Per-row columns of a segment: observations, actions and the row bookkeeping."""
    schema = {OBS + k: (np.dtype(s.dtype), tuple(s.shape)) for k, s in sorted(obs_space.spaces.items())}
    schema["action"] = schema[POLICY_ACTION] = (np.dtype(action_space.dtype), tuple(action_space.shape))
    schema.update({name: (dtype, ()) for name, dtype in ROW_COLUMNS.items()})
    return schema


def row_bytes(schema: dict[str, tuple[np.dtype, tuple]]) -> int:
    return sum(dtype.itemsize * int(np.prod(shape, dtype=np.int64)) for dtype, shape in schema.values())


@dataclass
class StreamState:
    """One (robot, epoch) stream: its index record, the record waiting for a successor, open episodes."""

    record: StreamRecord
    robot_index: int
    task_id: int
    pending: Columns | None = None  # one row, segment format
    pending_at: tuple[int, int] | None = None  # (segment id, row)
    episodes: dict[int, EpisodeRecord] = field(default_factory=dict)
    dropped: int = 0  # records that could not be paired (gaps)
    durable_seq: int = 0  # highest seq that a commit made durable
    records: int = 0  # step records stored for this stream (kept across restarts)

    def snapshot(self, episodes: list[int]) -> tuple:
        """What `layout` changes for a batch of these episode numbers, so a failed append can be
        undone (`restore`)."""
        touched = {n: self.episodes.get(n) for n in episodes}
        return (
            self.pending,
            self.pending_at,
            self.dropped,
            self.records,
            {n: None if ep is None else replace(ep) for n, ep in touched.items()},
        )

    def restore(self, saved: tuple) -> None:
        self.pending, self.pending_at, self.dropped, self.records, touched = saved
        for number, ep in touched.items():
            if ep is None:
                self.episodes.pop(number, None)
            else:
                self.episodes[number] = ep

    def episode(self, number: int) -> EpisodeRecord:
        ep = self.episodes.get(number)
        if ep is None:
            ep = self.episodes[number] = EpisodeRecord(self.record.id, number, self.record.robot, self.record.task)
        return ep


def layout(cols: Columns, stream: StreamState, segment_id: int, base: int, schema: dict) -> list[Columns]:
    """Rows for one validated wire batch, placed from row `base` of segment `segment_id`, as
    consecutive parts (a carried row, the records, the final observations): written and cached one
    after the other, never concatenated (that copied every image of the batch once more).

    Updates the stream's pending record and its episode statistics.
    """
    n = len(cols["reward"])
    episode, step = cols["episode"], cols["step"]
    ended = cols["terminated"] | cols["truncated"]
    final_rows = cols.get(FINAL_ROW, np.zeros(0, np.int64))
    continues_prev = np.zeros(n, bool)
    continues_prev[1:] = ~ended[:-1] & (episode[1:] == episode[:-1]) & (step[1:] == step[:-1] + 1)

    pending = stream.pending
    joins = pending is not None and episode[0] == pending["episode"][0] and step[0] == pending["step"][0] + 1
    carry = joins and stream.pending_at is not None and stream.pending_at[0] != segment_id
    first = base + int(carry)
    positions = first + np.arange(n, dtype=np.int32)

    prev = np.where(continues_prev, positions - 1, -1).astype(np.int32)
    if joins:
        prev[0] = base if carry else stream.pending_at[1]
    elif pending is not None:
        stream.dropped += 1
    stream.dropped += int(np.count_nonzero(~ended[:-1] & ~continues_prev[1:]))

    rows = _records(cols, n, prev, schema, stream)
    parts = [pending, rows] if carry else [rows]
    if len(final_rows):
        parts.append(_finals(cols, final_rows, positions, schema, stream))

    last = n - 1
    if ended[last]:
        stream.pending, stream.pending_at = None, None
    else:
        stream.pending = {k: v[last : last + 1].copy() for k, v in rows.items()}
        stream.pending["kind"][:] = KIND_CARRY
        stream.pending["prev_row"][:] = -1
        stream.pending_at = (segment_id, int(positions[last]))
    account(cols, stream, ended, segment_id)
    return parts


def _records(cols: Columns, n: int, prev: np.ndarray, schema: dict, stream: StreamState) -> Columns:
    rows: Columns = {}
    for name, (dtype, _shape) in schema.items():
        if name in cols:
            rows[name] = cols[name]
        elif name == POLICY_ACTION:
            rows[name] = cols["action"]
        elif name in DEFAULTED_COLUMNS:
            rows[name] = np.zeros(n, dtype)
    rows["stream"] = np.full(n, stream.record.id, np.int32)
    rows["kind"] = np.full(n, KIND_RECORD, np.uint8)
    rows["prev_row"] = prev
    rows["task"] = np.full(n, stream.task_id, np.int32)
    return rows


def _finals(cols: Columns, final_rows: np.ndarray, positions: np.ndarray, schema: dict, stream: StreamState) -> Columns:
    f = len(final_rows)
    rows: Columns = {}
    for name, (dtype, shape) in schema.items():
        if name.startswith(OBS):
            rows[name] = cols[FINAL_OBS + name.removeprefix(OBS)]
        else:
            rows[name] = np.zeros((f, *shape), dtype)
    rows["episode"] = cols["episode"][final_rows]
    rows["step"] = cols["step"][final_rows] + 1
    rows["stream"][:] = stream.record.id
    rows["kind"][:] = KIND_FINAL
    rows["prev_row"] = positions[final_rows].astype(np.int32)
    rows["task"][:] = stream.task_id
    return rows


def account(cols: Columns, stream: StreamState, ended: np.ndarray, segment_id: int) -> None:
    """Per-episode statistics for the index (a handful of episodes per batch)."""
    episode = cols["episode"]
    for number in np.unique(episode).tolist():
        mask = episode == number
        ep = stream.episode(int(number))
        versions = cols["policy_version"][mask]
        ep.length += int(mask.sum())
        ep.ret += float(cols["reward"][mask].sum())
        ep.interventions += int(np.count_nonzero(intervened(cols["actor"][mask])))
        ep.min_version = min(ep.min_version, int(versions.min()))
        ep.max_version = max(ep.max_version, int(versions.max()))
        ep.first_segment = segment_id if ep.first_segment < 0 else ep.first_segment
        ep.last_segment = segment_id
        end = np.flatnonzero(mask & ended)
        if len(end):
            row = end[-1]
            ep.status = "terminated" if cols["terminated"][row] else "truncated"
            label = int(cols["label"][row])
            ep.success = None if label == pb.LABEL_NONE else int(label == pb.LABEL_SUCCESS)


def successors(prev_row: np.ndarray, rows: int) -> np.ndarray:
    """next_row[i] = the row whose prev_row is i, or -1 (inverse of the stored links)."""
    next_row = np.full(len(prev_row), -1, np.int32)
    linked = np.flatnonzero(prev_row[:rows] >= 0)
    next_row[prev_row[linked]] = linked
    return next_row
