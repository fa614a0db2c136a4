"""How stale a row's policy was: how many versions the learner had published after the one that acted.

An edge acts with the newest weights it has, but weights take time to reach it, an edge whose link
drops keeps acting with an old version, and a spooled backlog arrives minutes late. Data from a policy
many versions behind is further off-policy than the algorithm expects. The ingest stamps each row with
its lag when the row arrives (`policy_lag`, stored in the buffer); the sampler then uses rows within
`buffer.max_policy_lag` as they are and down-weights or drops the older ones (`cache.py`, `store.py`).

The lag counts versions this learner published, not version numbers: a learner that restarts skips
up to a block of numbers (`version_lease.py`), and that gap is no policy update.
"""

from __future__ import annotations

import numpy as np

from user_rl.cloud.buffer.sampling import Growable
from user_rl.wire import user_rl_pb2 as pb


class PublishedVersions:
    """The versions this learner published, in order (they only grow)."""

    def __init__(self) -> None:
        self._versions = Growable(np.int64)

    @property
    def newest(self) -> int:
        """The newest version published (-1: none yet)."""
        return int(self._versions.data[len(self._versions) - 1]) if len(self._versions) else -1

    def add(self, version: int) -> None:
        if version <= self.newest:
            raise ValueError(f"policy versions only grow: {version} published after {self.newest}")
        self._versions.append(np.array([version], np.int64))

    def behind(self, versions: np.ndarray) -> np.ndarray:
        """For each version, how many published versions are newer (int32; a version older than all
        of this learner's counts them all)."""
        published = self._versions.view()
        return (len(published) - np.searchsorted(published, versions, side="right")).astype(np.int32)


def row_lags(columns: dict[str, np.ndarray], published: PublishedVersions) -> np.ndarray:
    """Each row's policy lag: versions published after the one that acted. 0 where the policy did
    not act (random warm-up, a person, the scripted intervener): the row's action is not the policy's."""
    lag = published.behind(columns["policy_version"])
    return np.where(policy_acted(columns), lag, 0).astype(np.int32)


def policy_acted(columns: dict[str, np.ndarray]) -> np.ndarray:
    """Rows whose action a published policy version chose (not warm-up, a person or the scripted intervener)."""
    return (columns["actor"] == pb.ACTOR_POLICY) & (columns["policy_version"] >= 0)


def stale_rows(lags: np.ndarray, max_lag: int | None) -> np.ndarray:
    """Which rows lagged more than `max_lag` versions (`buffer.max_policy_lag`; None: none did)."""
    return np.zeros(len(lags), bool) if max_lag is None else lags > max_lag


class LagCounts:
    """How many stored rows the policy acted with each lag (the last bin holds `MAX_BIN` and more):
    the staleness histogram of the learner's status and TensorBoard."""

    MAX_BIN = 32

    def __init__(self) -> None:
        self.counts = np.zeros(self.MAX_BIN + 1, np.int64)

    def add(self, lags: np.ndarray, columns: dict[str, np.ndarray]) -> None:
        acted = policy_acted(columns)
        self.counts += np.bincount(np.minimum(lags[acted], self.MAX_BIN), minlength=self.MAX_BIN + 1)
