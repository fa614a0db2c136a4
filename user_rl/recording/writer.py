"""Recorded steps straight into a buffer directory, written by the learner's own `PersistentReplay`,
so `user-rl buffer export`, `buffer inspect` and `buffer.attach` read it like any run's buffer.

The recording is one stream of the robot, its epoch one past the robot's newest in the directory
(a second session appends to the same buffer; its spaces must be the same). Rows go in batches of
about a second (`BatchBuilder`, the edge's own adder) and each batch is made durable at once; a
discarded episode keeps its rows, marked as LeRobot's re-record is everywhere in user-rl (never
sampled, left out of exports unless asked for).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym

from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.config import BufferConfig
from user_rl.edge.batching import BatchBuilder
from user_rl.wire.transitions import DISCARD


class EpisodeWriter:
    """The recording's stream in the buffer at `directory`: rows in, durable per batch."""

    def __init__(
        self,
        directory: str | Path,
        robot_id: str,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        task: str,
        control_hz: float,
        batch_rows: int,
    ) -> None:
        self.directory = Path(directory)
        if self.directory.is_dir() and any(self.directory.iterdir()) and not (self.directory / "index.sqlite").exists():
            raise FileExistsError(
                f"{self.directory} holds files and no buffer: record into a new directory or a buffer"
            )
        self.store = PersistentReplay(self.directory, obs_space, action_space, BufferConfig(scrub=False))
        try:
            mine = [s for s in self.store.index.streams() if s.robot == robot_id]
            self.epoch = 1 + max((s.epoch for s in mine), default=0)
            self.kept_before = sum(  # episodes of this robot an export (and replay's --episode) counts first
                1
                for e in self.store.index.episodes()
                if e.robot == robot_id and e.end_reason != DISCARD and e.length > 0
            )
            self.stream = self.store.open_stream(robot_id, self.epoch, task, control_hz)
        except BaseException:
            self.store.close()
            raise
        self.rows = BatchBuilder(obs_space, action_space, max(1, batch_rows))
        self.seq = 0
        self.written = 0  # step rows made durable

    def add(self, **row: Any) -> None:
        """One step (`BatchBuilder.add`'s arguments); a full batch is written and made durable."""
        self.rows.add(**row)
        if self.rows.full:
            self.flush()

    def flush(self) -> None:
        """Write the rows added so far and make them durable (an episode's end does)."""
        if not self.rows.count:
            return
        taken = self.rows.take_batch()
        self.seq += 1
        self.store.add(self.stream, self.seq, taken.columns, taken.people)
        self.store.commit()
        self.written += taken.count

    def discard_open(self) -> None:
        """The episode in progress is over and left out: its rows stay, marked discarded."""
        self.flush()
        self.store.end_open_episodes(self.stream, reason=DISCARD)

    def close(self) -> None:
        """Write what is left and seal the buffer (safe twice)."""
        try:
            self.flush()
        finally:
            self.store.close()
