"""Collects transitions into preallocated column arrays, one batch message at a time.

This is the edge's "adder": the control loop calls `add` once per step and never sees a socket.
People are named per batch: a row's person columns hold 1 + the index of a name in the batch's
`people` (`wire/transitions.PEOPLE`), each name listed once.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from user_rl.wire.transitions import (
    ACTOR_PERSON,
    FINAL_OBS,
    FINAL_ROW,
    LABEL_PERSON,
    MAX_BATCH_PEOPLE,
    OBS,
    OPTIONAL_COLUMNS,
    POLICY_ACTION,
    SCALAR_COLUMNS,
    person_name,
)


@dataclass(frozen=True)
class TakenBatch:
    """A batch's rows as fresh arrays, and the names its person columns refer to."""

    count: int
    columns: dict[str, np.ndarray]
    people: tuple[str, ...] = ()


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
        self.people: dict[str, int] = {}  # the batch's names, by their id (1 + index)
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
        person: str = "",
        label_person: str = "",
    ) -> None:
        """Record one step. `final_obs` is required when the episode ends at this step;
        `policy_action` is what the policy proposed when someone else acted (else the action);
        `chunk_step` is that proposal's index in the policy's action chunk; `idle`: a person drove
        and held nothing (`transitions.IDLE`); `person`, `label_person`: the names of the person who
        acted and of the one who labelled the row ("": nobody)."""
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
        c[ACTOR_PERSON][i], c[LABEL_PERSON][i] = self._person_id(person), self._person_id(label_person)
        c[POLICY_ACTION][i] = action if policy_action is None else policy_action
        if terminated or truncated:
            if final_obs is None:
                raise ValueError("an episode that ends needs its final observation")
            self.final_obs.append({k: np.array(final_obs[k]) for k in self.obs_keys})
            self.final_rows.append(i)
        self.count += 1

    def _person_id(self, name: str) -> int:
        """The batch's id for a person's name (made if new); 0 for nobody, and for a name past the
        batch's MAX_BATCH_PEOPLE (a page that sends name after name costs a bounded batch)."""
        name = person_name(name) if name else ""
        if not name:
            return 0
        known = self.people.get(name)
        if known is None and len(self.people) < MAX_BATCH_PEOPLE:
            known = self.people[name] = len(self.people) + 1
        return known or 0

    def take_batch(self) -> TakenBatch:
        """The filled rows as fresh arrays (safe to keep until acked) with their people's names, and reset."""
        n = self.count
        out = {name: col[:n].copy() for name, col in self.cols.items()}
        out[FINAL_ROW] = np.asarray(self.final_rows, np.int64)
        if self.final_rows:
            for k in self.obs_keys:
                out[FINAL_OBS + k] = np.stack([f[k] for f in self.final_obs])
        people = tuple(self.people)
        self.final_obs, self.final_rows, self.people, self.count = [], [], {}, 0
        return TakenBatch(n, out, people)

    def take(self) -> tuple[int, dict[str, np.ndarray]]:
        """`take_batch` of a batch that names nobody, as (count, columns); one that names people
        raises (its names would be lost): take it with `take_batch`."""
        if self.people:
            raise ValueError(f"the batch names {len(self.people)} people: take it with take_batch() to keep them")
        taken = self.take_batch()
        return taken.count, taken.columns
