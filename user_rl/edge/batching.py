"""Collects transitions into preallocated column arrays, one batch message at a time.

This is the edge's "adder": the control loop calls `add` once per step and never sees a socket.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from user_rl.wire.transitions import FINAL_OBS, FINAL_ROW, OBS, OPTIONAL_COLUMNS, POLICY_ACTION, SCALAR_COLUMNS


class BatchBuilder:
    def __init__(self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, capacity: int) -> None:
        self.capacity = capacity
        self.obs_keys = sorted(obs_space.spaces)
        self.cols: dict[str, np.ndarray] = {
            OBS + k: np.zeros((capacity, *obs_space[k].shape), obs_space[k].dtype) for k in self.obs_keys
        }
        self.cols["action"] = np.zeros((capacity, *action_space.shape), action_space.dtype)
        self.cols[POLICY_ACTION] = np.zeros((capacity, *action_space.shape), action_space.dtype)
        for name, dtype in {**SCALAR_COLUMNS, **OPTIONAL_COLUMNS}.items():
            self.cols[name] = np.zeros(capacity, dtype)
        self.final_obs: list[dict[str, np.ndarray]] = []
        self.final_rows: list[int] = []
        self.count = 0

    @property
    def full(self) -> bool:
        return self.count >= self.capacity

    def add(
        self,
        obs: dict[str, np.ndarray],
        action: np.ndarray,
        reward: float,
        terminated: bool,
        truncated: bool,
        *,
        episode: int,
        step: int,
        policy_version: int,
        actor: int,
        label: int,
        sensor_time: float,
        final_obs: dict[str, np.ndarray] | None = None,
        label_by: int = 0,
        policy_action: np.ndarray | None = None,
        chunk_step: int = 0,
        idle: bool = False,
    ) -> None:
        """Record one step. `final_obs` is required when the episode ends at this step;
        `policy_action` is what the policy proposed when someone else acted (else the action);
        `chunk_step` is that proposal's index in the policy's action chunk; `idle`: a person drove
        and held nothing (`transitions.IDLE`)."""
        if self.full:
            raise RuntimeError("batch is full; take() it first")
        i = self.count
        for k in self.obs_keys:
            self.cols[OBS + k][i] = obs[k]
        c = self.cols
        c["action"][i] = action
        c["reward"][i], c["terminated"][i], c["truncated"][i] = reward, terminated, truncated
        c["episode"][i], c["step"][i], c["policy_version"][i] = episode, step, policy_version
        c["actor"][i], c["label"][i], c["label_by"][i], c["sensor_time"][i] = actor, label, label_by, sensor_time
        c["chunk_step"][i], c["idle"][i] = chunk_step, idle
        c[POLICY_ACTION][i] = action if policy_action is None else policy_action
        if terminated or truncated:
            if final_obs is None:
                raise ValueError("an episode that ends needs its final observation")
            self.final_obs.append({k: np.array(final_obs[k]) for k in self.obs_keys})
            self.final_rows.append(i)
        self.count += 1

    def take(self) -> tuple[int, dict[str, np.ndarray]]:
        """The filled rows as fresh arrays (safe to keep until acked), and reset."""
        n = self.count
        out = {name: col[:n].copy() for name, col in self.cols.items()}
        out[FINAL_ROW] = np.asarray(self.final_rows, np.int64)
        if self.final_rows:
            for k in self.obs_keys:
                out[FINAL_OBS + k] = np.stack([f[k] for f in self.final_obs])
        self.final_obs, self.final_rows, self.count = [], [], 0
        return n, out
