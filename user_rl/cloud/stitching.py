"""Turn a robot's stream of records into complete transitions (obs, action, ..., next obs).

Record t's next observation is record t+1's observation when both belong to the same episode
and are consecutive steps, or the explicit final observation when the episode ended at t.
Anything else (a gap, an edge that restarted mid-episode) leaves record t without a next
observation and it is dropped rather than paired with an unrelated state.
"""

from __future__ import annotations

import numpy as np

from user_rl.wire.transitions import FINAL_OBS, FINAL_ROW, OBS

Columns = dict[str, np.ndarray]


class EpisodeStitcher:
    """Per-robot pairing state: the last record of the previous batch, waiting for its successor."""

    def __init__(self, obs_keys: list[str]) -> None:
        self.obs_keys = obs_keys
        self._pending: Columns | None = None
        self.dropped = 0

    def reset(self) -> None:
        """Forget the pending record (a new stream epoch: the old episode cannot continue)."""
        if self._pending is not None:
            self.dropped += 1
        self._pending = None

    def stitch(self, cols: Columns) -> Columns:
        """Complete transitions made available by this batch (possibly none)."""
        episode, step = cols["episode"], cols["step"]
        ended = cols["terminated"] | cols["truncated"]
        continues = ~ended[:-1] & (episode[1:] == episode[:-1]) & (step[1:] == step[:-1] + 1)
        inner = np.flatnonzero(continues)
        final_rows = cols.get(FINAL_ROW, np.zeros(0, np.int64))
        self.dropped += int(np.count_nonzero(~ended[:-1] & ~continues))

        pieces: list[Columns] = []
        if self._pending is not None:
            prev = self._pending
            if episode[0] == prev["episode"][0] and step[0] == prev["step"][0] + 1:
                pieces.append(self._with_next(prev, {k: cols[OBS + k][:1] for k in self.obs_keys}))
            else:
                self.dropped += 1
        rows = np.concatenate([inner, final_rows])
        if len(rows):
            next_obs = {k: cols[OBS + k][inner + 1] for k in self.obs_keys}
            if len(final_rows):
                next_obs = {k: np.concatenate([v, cols[FINAL_OBS + k]]) for k, v in next_obs.items()}
            pieces.append(self._with_next(_take(cols, rows), next_obs))
        last = len(episode) - 1
        self._pending = None if ended[last] else _take(cols, np.array([last]))
        if not pieces:
            return {}
        return {key: np.concatenate([p[key] for p in pieces]) for key in pieces[0]}

    @staticmethod
    def _with_next(rows: Columns, next_obs: dict[str, np.ndarray]) -> Columns:
        out = dict(rows)
        out.update({"next_" + OBS + k: v for k, v in next_obs.items()})
        return out


def _take(cols: Columns, rows: np.ndarray) -> Columns:
    """Copy the given rows of every per-row column (copies: frames belong to the socket)."""
    return {
        key: np.ascontiguousarray(value[rows])
        for key, value in cols.items()
        if not key.startswith(FINAL_OBS) and key != FINAL_ROW
    }
