"""Labelled frames for the success classifier, read from a run's replay buffer (read-only).

A label sits on an episode's last row (a person's mark ends the episode; a sim's success flag is
read at the end), so labels name episodes, and frames are picked from labelled episodes:

- positive: the last `positives` frames of a success episode: its final observation (the one the
  success was seen in) and the `positives - 1` before it;
- negative: every frame of a failure episode, and a success episode's frames before its last
  `positives` (the task was not done yet: these near misses are the negatives a classifier most
  needs, or a policy learns to stop just short). After a person's mark, the `positives` frames
  before the positives are left out, since a person marks success a moment after it happened;
- unlabelled episodes are not used.

A frame is an observation of a step record or an episode's final observation. Only sealed
segments are read (a run that stopped cleanly has sealed them all). This module reads the
buffer's files, so it is for tools (`user-rl reward train`), never imported by an edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from user_rl.cloud.buffer.rows import KIND_FINAL, KIND_RECORD
from user_rl.cloud.buffer.segment import read_segment
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import OBS


class NoLabelledFrames(ValueError):
    """The buffer holds nothing to train a classifier on."""


@dataclass
class LabelledFrames:
    obs: dict[str, np.ndarray]  # key -> (n, *shape)
    success: np.ndarray  # (n,) bool
    episode: np.ndarray  # (n,) int64: a number per labelled episode (for held-out splits)

    def __len__(self) -> int:
        return len(self.success)

    def take(self, rows: np.ndarray) -> LabelledFrames:
        return LabelledFrames({k: v[rows] for k, v in self.obs.items()}, self.success[rows], self.episode[rows])


def buffer_directory(path: str | Path) -> Path:
    """A run directory (its `buffer/`) or a buffer directory itself."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no run or buffer directory at {path}")
    for candidate in (path / "buffer", path):
        if any(candidate.glob("seg-*.seg")):
            return candidate
    raise NoLabelledFrames(
        f"{path}: no sealed buffer segments here or in {path / 'buffer'} (is it a run or "
        "buffer directory? a run still going has not sealed its newest rows)"
    )


def labelled_frames(path: str | Path, keys: list[str], positives: int = 1) -> LabelledFrames:
    """The labelled frames of the buffer at `path` (see the module docstring for which are which).
    Two passes over the segments: the labels first, then only the chosen frames are copied."""
    if positives < 1:
        raise ValueError(f"positives must be at least 1, got {positives}")
    directory = buffer_directory(path)
    files = sorted(directory.glob("seg-*.seg"))
    outcome: dict[
        tuple[int, int], tuple[bool, int, int]
    ] = {}  # (stream, episode) -> (success, final frame's step, margin)
    for file in files:
        cols = read_segment(file, verify=True).columns
        for row in np.flatnonzero((cols["kind"] == KIND_RECORD) & (cols["label"] != pb.LABEL_NONE)):
            key = (int(cols["stream"][row]), int(cols["episode"][row]))
            margin = positives if cols["label_by"][row] == pb.LABEL_BY_PERSON else 0
            outcome[key] = (bool(cols["label"][row] == pb.LABEL_SUCCESS), int(cols["step"][row]) + 1, margin)
    if not outcome:
        raise NoLabelledFrames(
            f"{directory}: no labelled episodes (no row labelled success or failure): label "
            "episodes on the teleop page, or record a sim that reports is_success"
        )
    numbers = {key: i for i, key in enumerate(sorted(outcome))}
    obs: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    success, episode = [], []
    for file in files:
        cols = read_segment(file, verify=False).columns  # verified in the first pass
        missing = [k for k in keys if OBS + k not in cols]
        if missing:
            have = sorted(name.removeprefix(OBS) for name in cols if name.startswith(OBS))
            raise ValueError(f"the buffer's observations have no {missing[0]!r}; they have: {', '.join(have)}")
        frame = (cols["kind"] == KIND_RECORD) | (cols["kind"] == KIND_FINAL)
        found = [
            (numbers[key], *outcome[key]) if key in outcome else (-1, False, 0, 0)
            for key in zip(cols["stream"].tolist(), cols["episode"].tolist())
        ]
        number = np.array([f[0] for f in found], np.int64)
        known = frame & (number >= 0)
        won = known & np.array([f[1] for f in found], bool)
        final_step = np.array([f[2] for f in found], np.int64)
        margin = np.array([f[3] for f in found], np.int64)
        from_end = final_step - cols["step"].astype(np.int64)  # 0: the episode's final frame
        positive = won & (from_end >= 0) & (from_end < positives)
        negative = known & (~won | (from_end >= positives + margin))
        rows = np.flatnonzero(positive | negative)
        for k in keys:
            obs[k].append(np.array(cols[OBS + k][rows]))
        success.append(positive[rows])
        episode.append(number[rows])
    frames = LabelledFrames(
        {k: np.concatenate(v) for k, v in obs.items()}, np.concatenate(success), np.concatenate(episode)
    )
    if frames.success.all() or not frames.success.any():
        kind = "success" if not frames.success.any() else "failure"
        raise NoLabelledFrames(f"{directory}: the labelled episodes give no {kind} frames; the classifier needs both")
    return frames
