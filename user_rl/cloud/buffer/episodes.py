"""Read a buffer directory back as whole episodes, in step order: what exports need.

Sampling never needs episodes (it pairs rows through `prev_row`), but a dataset format does. A
segment holds three kinds of rows (`rows.py`): step records, each episode's final observation, and
carries (copies of a record from an older segment, so its successor can link to it inside one
segment). Records are gathered per (stream, episode) and sorted by step; carries are skipped (the
original is read too); a final row gives its episode's final observation through the row it
links to. Read-only: the directory may belong to a running learner or to an earlier run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np

from user_rl.cloud.buffer.index import EpisodeRecord
from user_rl.cloud.buffer.recovery import open_index_read_only
from user_rl.cloud.buffer.rows import DEFAULTED_COLUMNS, KIND_FINAL, KIND_RECORD
from user_rl.cloud.buffer.segment import read_segment
from user_rl.wire.spaces import spaces_from_text
from user_rl.wire.transitions import ACTOR_PERSON, DISCARD, LABEL_PERSON, OBS, intervened

# Per-step columns an episode carries besides its observations (the buffer's bookkeeping left out).
STEP_COLUMNS = (
    "action",
    "policy_action",
    "reward",
    "terminated",
    "truncated",
    "step",
    "policy_version",
    "actor",
    "label",
    "label_by",
    "sensor_time",
    "chunk_step",
    "idle",
    ACTOR_PERSON,  # ids of `Episode.people`
    LABEL_PERSON,
)


@dataclass
class Episode:
    """One episode of one robot: `steps` holds each column in step order (observations under `obs/`).
    (robot, epoch, number) names it: episode numbers restart at 0 in each epoch (edge life)."""

    robot: str
    task: str
    number: int
    status: str  # terminated / truncated / open (still running, or cut by a crash)
    steps: dict[str, np.ndarray]
    final_obs: dict[str, np.ndarray] | None = None  # the observation after the last step, when the episode ended
    end_reason: str = ""
    epoch: int = 0  # the edge life it was recorded in
    people: dict[int, str] = field(default_factory=dict)  # the buffer's names of the person columns' ids

    def __len__(self) -> int:
        return len(self.steps["action"])

    @property
    def interventions(self) -> int:
        return int(np.count_nonzero(intervened(self.steps["actor"])))


@dataclass
class EpisodeFilter:
    """Which episodes to read: by robot, by task, only those with interventions; episodes a person
    discarded (re-record) only when asked for."""

    robots: list[str] | None = None
    tasks: list[str] | None = None
    with_interventions: bool = False
    with_discarded: bool = False

    def admits(self, record: EpisodeRecord) -> bool:
        return (
            (self.robots is None or record.robot in self.robots)
            and (self.tasks is None or record.task in self.tasks)
            and (not self.with_interventions or record.interventions > 0)
            and (self.with_discarded or record.end_reason != DISCARD)
        )


@dataclass
class _Parts:
    rows: list[dict[str, np.ndarray]] = field(default_factory=list)
    final: dict[str, np.ndarray] | None = None


def buffer_spaces(directory: str | Path) -> tuple[gym.spaces.Dict, gym.spaces.Box]:
    """The observation and action spaces a buffer directory was written with."""
    index = open_index_read_only(Path(directory) / "index.sqlite")
    try:
        return _spaces(index, directory)
    finally:
        index.close()


def _spaces(index, directory: str | Path) -> tuple[gym.spaces.Dict, gym.spaces.Box]:
    stored = index.get_meta("spaces")
    if stored is None:
        raise ValueError(f"{directory}: the buffer holds no data yet (no spaces recorded)")
    return spaces_from_text({"hello_hex": stored})


def count_episodes(directory: str | Path, which: EpisodeFilter | None = None) -> int:
    """How many episodes `read_episodes` will yield (from the index alone: cheap)."""
    which = which or EpisodeFilter()
    index = open_index_read_only(Path(directory) / "index.sqlite")
    try:
        return sum(1 for record in index.episodes() if which.admits(record))
    finally:
        index.close()


def recorded_rates(directory: str | Path, which: EpisodeFilter | None = None) -> dict[str, float]:
    """The control rate (Hz) of each robot with an episode `which` admits; 0.0 where the buffer has
    none (a robot without a clock, or a buffer written before it was kept)."""
    which = which or EpisodeFilter()
    index = open_index_read_only(Path(directory) / "index.sqlite")
    try:
        rates = index.control_rates()
        robots = sorted({record.robot for record in index.episodes() if which.admits(record)})
        return {robot: rates.get(robot, 0.0) for robot in robots}
    finally:
        index.close()


def read_episodes(directory: str | Path, which: EpisodeFilter | None = None) -> Iterator[Episode]:
    """The buffer's episodes that `which` admits, oldest stream first. Segments are read once each;
    an episode is yielded as soon as no later segment can hold more of it."""
    directory, which = Path(directory), which or EpisodeFilter()
    index = open_index_read_only(directory / "index.sqlite")
    try:
        obs_space, _ = _spaces(index, directory)
        records = {(r.stream, r.episode): r for r in index.episodes() if which.admits(r)}
        epochs = {s.id: s.epoch for s in index.streams()}
        segments = index.segments()
        people = index.people()  # after the segments: every id their rows hold is named
    finally:
        index.close()
    obs_keys = [OBS + key for key in sorted(obs_space.spaces)]
    last_segment = {key: r.last_segment for key, r in records.items()}  # -1 while unknown
    parts: dict[tuple[int, int], _Parts] = {}
    for seg_record in segments:
        segment = read_segment(directory / seg_record.file, verify=True)
        cols = {
            name: np.asarray(segment.columns[name])
            if name in segment.columns
            else np.zeros(segment.rows, DEFAULTED_COLUMNS[name])
            for name in (*obs_keys, *STEP_COLUMNS, "stream", "kind", "prev_row", "episode")
        }
        _collect(cols, records, parts, obs_keys)
        # done once a later segment is read (an episode's final row may sit one segment after its last record)
        for key in [k for k in parts if 0 <= last_segment[k] < seg_record.id]:
            yield from _episode(records[key], parts.pop(key), epochs, people)
    for key in sorted(parts):  # episodes still open, or whose last segment is the newest
        yield from _episode(records[key], parts.pop(key), epochs, people)


def _collect(
    cols: dict[str, np.ndarray], records: dict, parts: dict[tuple[int, int], _Parts], obs_keys: list[str]
) -> None:
    """Add one segment's records and final observations to the episodes they belong to."""
    keys = list(zip(cols["stream"].tolist(), cols["episode"].tolist()))
    for row in np.flatnonzero(cols["kind"] == KIND_RECORD):
        key = keys[row]
        if key in records:
            parts.setdefault(key, _Parts()).rows.append({name: cols[name][row] for name in (*obs_keys, *STEP_COLUMNS)})
    for row in np.flatnonzero(cols["kind"] == KIND_FINAL):
        key = keys[int(cols["prev_row"][row])]  # the episode's last record (or its carry) in this segment
        if key in records:
            parts.setdefault(key, _Parts()).final = {name[len(OBS) :]: cols[name][row].copy() for name in obs_keys}


def _episode(record: EpisodeRecord, parts: _Parts, epochs: dict[int, int], people: dict[int, str]) -> Iterator[Episode]:
    """The episode, unless none of its steps is left (evicted: only a final row remains)."""
    if not parts.rows:
        return
    ordered = sorted(parts.rows, key=lambda row: int(row["step"]))
    steps = {name: np.stack([row[name] for row in ordered]) for name in ordered[0]}
    yield Episode(
        robot=record.robot,
        task=record.task,
        number=record.episode,
        status=record.status,
        steps=steps,
        final_obs=parts.final,
        end_reason=record.end_reason,
        epoch=epochs.get(record.stream, 0),
        people=people,
    )
