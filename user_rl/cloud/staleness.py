"""How stale a row's policy was: how many versions the learner had published after the one that acted.

An edge acts with the newest weights it has, but weights take time to reach it, an edge whose link
drops keeps acting with an old version, and a spooled backlog arrives minutes late. Data from a policy
many versions behind is further off-policy than the algorithm expects. The ingest stamps each row with
its lag when the row arrives (`policy_lag`, stored in the buffer); the sampler then uses rows within
`buffer.max_policy_lag` as they are and down-weights or drops the older ones (`cache.py`, `store.py`).

The lag counts versions this run's learners published, not version numbers: a learner that restarts
skips up to a block of numbers (`version_lease.py`), and that gap is no policy update. The versions
published are kept in the run directory (`PUBLISHED_FILE`), so a restarted learner still counts
the ones its predecessors published after a row's version.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from user_rl.files import replace_durably
from user_rl.wire import user_rl_pb2 as pb

log = logging.getLogger(__name__)


PUBLISHED_FILE = "policy_versions.published"


class PublishedVersions:
    """The versions this run's learners published, in order (they only grow), as runs of consecutive
    numbers: a learner publishes consecutive versions, and each restart starts a new run.

    With a `path` the runs are kept in that file, so a resumed learner counts the versions its
    predecessors published after a row's version (without it, every older version would lag by
    one). The file is replaced atomically at each publish, and fsynced when a learner's first
    version starts a new run; after a power cut the previous learner's last few versions may be
    missing from it, never a version that was not published.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._runs: list[list[int]] = self._read() if self.path is not None else []
        self._last_before = self._runs[-1][1] if self._runs else -1  # published by earlier learners
        self._refresh()

    def _read(self) -> list[list[int]]:
        try:
            runs = json.loads(self.path.read_text())["runs"]
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{self.path} does not hold the published policy versions ({exc}); delete it "
                "to count policy lags from this learner's versions only"
            ) from None
        ok = all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) for v in r) and r[0] <= r[1] for r in runs
        ) and all(a[1] < b[0] for a, b in zip(runs, runs[1:]))
        if not ok:
            raise ValueError(
                f"{self.path}: runs of published versions must be increasing [first, last] pairs, got {str(runs)[:200]}"
            )
        return [list(r) for r in runs]

    def _refresh(self) -> None:
        """The arrays `behind` searches: run starts and ends, and how many versions each run and
        all later ones hold."""
        runs = np.array(self._runs, np.int64).reshape(-1, 2)
        self._starts, self._ends = runs[:, 0], runs[:, 1]
        sizes = self._ends - self._starts + 1
        self._from = np.concatenate([np.cumsum(sizes[::-1])[::-1], [0]]).astype(np.int64)

    @property
    def newest(self) -> int:
        """The newest version this learner published (-1: none yet; earlier learners' do not count:
        their weights are not served)."""
        last = self._runs[-1][1] if self._runs else -1
        return last if last > self._last_before else -1

    def add(self, version: int) -> None:
        last = self._runs[-1][1] if self._runs else -1
        if version <= last:
            raise ValueError(f"policy versions only grow: {version} published after {last}")
        new_run = version != last + 1 or self.newest < 0
        if new_run:
            self._runs.append([version, version])
        else:
            self._runs[-1][1] = version
        self._refresh()
        self._save(durably=new_run)

    def _save(self, durably: bool) -> None:
        if self.path is None:
            return
        text = json.dumps({"runs": self._runs})
        try:
            if durably:
                replace_durably(self.path, text)
            else:
                tmp = self.path.with_name(self.path.name + ".tmp")
                tmp.write_text(text)
                os.replace(tmp, self.path)
        except OSError as error:  # lags of this learner's rows stay right; a restart would count fewer
            log.warning("could not record the published policy versions in %s: %s", self.path, error)

    def behind(self, versions: np.ndarray) -> np.ndarray:
        """For each version, how many published versions are newer (int32; a version older than all
        of this run's counts them all)."""
        versions = np.asarray(versions, np.int64)
        run = np.searchsorted(self._ends, versions, side="right")  # the first run that ends after it
        start = np.append(self._starts, 0)[run]
        inside = np.where(run < len(self._starts), np.maximum(versions - start + 1, 0), 0)
        return (self._from[run] - inside).astype(np.int32)


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


class UpdateLags:
    """How many updates the learner had made beyond the version that acted, for each row the policy
    acted, when the row was stored: the staleness an off-policy update sees, in the unit that
    moves the policy (a version count depends on how often the learner publishes).

    It counts from `published(version, updates)` of this learner's versions (the newest
    `MAX_VERSIONS`); a row of an older version (an earlier learner's, a long-spooled backlog) is
    counted as `unknown`. `report` gives the distribution over the last `WINDOW` rows."""

    WINDOW = 20_000
    MAX_VERSIONS = 1 << 16

    def __init__(self) -> None:
        self._versions = np.zeros(self.MAX_VERSIONS, np.int64)
        self._updates = np.zeros(self.MAX_VERSIONS, np.int64)
        self._known = 0  # versions held, oldest first
        self._window = np.zeros(self.WINDOW, np.int64)
        self._rows = 0  # rows measured since start (the window holds the last WINDOW of them)
        self.unknown = 0

    def published(self, version: int, updates: int) -> None:
        """Version `version` holds the actor after `updates` updates."""
        if self._known == self.MAX_VERSIONS:  # forget the older half: O(1) a version, amortised
            half = self.MAX_VERSIONS // 2
            self._versions[:half], self._updates[:half] = self._versions[half:], self._updates[half:]
            self._known = half
        self._versions[self._known], self._updates[self._known] = version, updates
        self._known += 1

    def add(self, columns: dict[str, np.ndarray], updates_now: int) -> None:
        """Measure the rows of one stored batch, `updates_now` being the learner's count as it stores them."""
        versions = columns["policy_version"][policy_acted(columns)].astype(np.int64)
        if not len(versions):
            return
        held = self._versions[: self._known]  # increasing
        at = np.minimum(np.searchsorted(held, versions), max(self._known - 1, 0))
        known = held[at] == versions if self._known else np.zeros(len(versions), bool)
        self.unknown += int(np.count_nonzero(~known))
        lags = np.maximum(updates_now - self._updates[at[known]], 0)[-self.WINDOW :]
        slots = (self._rows + np.arange(len(lags))) % self.WINDOW
        self._window[slots] = lags
        self._rows += len(lags)

    def report(self) -> dict:
        """p50 / p90 / p99 / max of the last rows' lags in updates, how many rows that is, and the
        rows whose version was not known (all since the learner started)."""
        lags = self._window[: min(self._rows, self.WINDOW)]
        if not len(lags):
            return {"rows": 0, "unknown": self.unknown}
        p50, p90, p99 = np.percentile(lags, [50, 90, 99])
        return {
            "rows": len(lags),
            "p50": float(p50),
            "p90": float(p90),
            "p99": float(p99),
            "max": int(lags.max()),
            "mean": round(float(lags.mean()), 2),
            "unknown": self.unknown,
        }
