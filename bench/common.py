"""What several benches share: the raw in-RAM baseline of the sampling benches, writing a result, and
the environment of a bench's child processes."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import numpy as np


class RawColumns:
    """The sampling benches' baseline: one in-RAM array per column, gathered with numpy. A batch is
    obs[idx], obs[idx + 1] and the scalar columns for uniform random idx, the same columns
    `PersistentReplay.sample` returns (obs/*, next_obs/*, action, reward, terminated,
    policy_version, robot)."""

    def __init__(
        self, obs: dict[str, np.ndarray], action: np.ndarray, reward: np.ndarray, policy_version: np.ndarray
    ) -> None:
        self.obs = obs
        self.n = len(action)
        self.action, self.reward, self.policy_version = action, reward, policy_version
        self.terminated = np.zeros(self.n, np.bool_)
        self.robot = np.zeros(self.n, np.int32)

    def first(self, n: int) -> RawColumns:
        """The same arrays (not copied), sampled from their first `n` rows only."""
        raw = copy.copy(self)
        raw.n = n
        return raw

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        idx = rng.integers(0, self.n - 1, batch)
        nxt = idx + 1
        return {
            **{f"obs/{key}": column[idx] for key, column in self.obs.items()},
            **{f"next_obs/{key}": column[nxt] for key, column in self.obs.items()},
            "action": self.action[idx],
            "reward": self.reward[idx],
            "terminated": self.terminated[idx],
            "policy_version": self.policy_version[idx],
            "robot": self.robot[idx],
        }


def write_result(out: str | Path | None, result: dict) -> None:
    """A bench's result as indented JSON in `out` (its --out); nothing without one."""
    if out:
        Path(out).write_text(json.dumps(result, indent=2))


CHECKOUT = Path(__file__).resolve().parents[1]


def checkout_env() -> dict[str, str]:
    """This process's environment with this checkout first on PYTHONPATH: a bench's child process
    (`python -m user_rl.cli ...`) runs the code beside the bench, not whatever `user_rl` the
    interpreter has installed (an editable install left pointing at another clone)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(CHECKOUT), *([path] if path else [])])}
