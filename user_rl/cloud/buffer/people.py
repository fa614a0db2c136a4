"""The run's people: the names the rows' person columns (`actor_person`, `label_person`) refer to.

A batch names its people in a list beside its rows (`wire/transitions.PEOPLE`); the buffer gives
each name one id for the whole run, kept in its index (`people` table) and made durable before the
rows that use it are written, so a crash never leaves an id without its name: an id is committed to
SQLite (synchronous) before its rows reach the open segment, and rows are acknowledged only after
that. Ids are never reused or renamed; a name that was never stored is harmless.

Bounded: at most MAX_PEOPLE names per buffer (a few hundred kilobytes at 40 characters each);
past that a new name's rows read as nobody named, counted and logged once, so a page that sends name
after name cannot grow the learner's memory or the index without limit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from user_rl.cloud.buffer.index import BufferIndex
from user_rl.wire.transitions import PERSON_COLUMNS, check_people

log = logging.getLogger(__name__)

MAX_PEOPLE = 4096  # names a buffer keeps (the columns are uint16)


class PeopleTable:
    """Name <-> run-wide id, loaded from the index at open; new names are written before use."""

    def __init__(self, index: BufferIndex) -> None:
        self.index = index
        self.names = index.people()
        self.ids = {name: i for i, name in self.names.items()}
        self.next_id = max(self.names, default=0) + 1
        self.unnamed_rows = 0  # person ids left unnamed because the buffer's table was full

    def stored(self, cols: dict[str, np.ndarray], people: Sequence[str]) -> dict[str, np.ndarray]:
        """`cols` with the person columns turned from the batch's ids (into `people`) into the run's;
        new names are recorded in the index first. Raises `WireError` for ids `people` does not name."""
        check_people(cols, people)
        if not people:
            return cols
        new: dict[int, str] = {}
        for name in people:
            if name not in self.ids and len(self.ids) + len(new) < MAX_PEOPLE:
                new[self.next_id + len(new)] = name
        if new:
            self.index.add_people(new)  # durable before any row names them
            self.names.update(new)
            self.ids.update({name: i for i, name in new.items()})
            self.next_id += len(new)
        remap = np.array([0, *(self.ids.get(name, 0) for name in people)], np.uint16)
        out = dict(cols)
        for column in PERSON_COLUMNS:
            if column in cols:
                out[column] = remap[cols[column]]
                lost = int(np.count_nonzero((cols[column] > 0) & (out[column] == 0)))
                if lost and not self.unnamed_rows:
                    log.warning(
                        "the buffer keeps %d people's names: rows of people past them read as unnamed", MAX_PEOPLE
                    )
                self.unnamed_rows += lost
        return out
