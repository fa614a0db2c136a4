"""`reward.type: classifier`: a learned success classifier judges every step on the edge (HIL-SERL).

It reads the observation after the step (`reward.keys`). Judged success (P >= `reward.threshold`):
reward 1, and the episode ends there as terminated with label LABEL_SUCCESS by
LABEL_BY_CLASSIFIER. Otherwise reward 0; an episode that ends without a judged success (time
limit, a reset) is labelled LABEL_FAILURE by the classifier. A person's mark wins over the
classifier (success: 1, failure: 0). The env's own reward and success flag are not recorded:
nothing of the env's judgement leaves the edge. The env's `terminated` still ends an episode
(for a sim whose termination means success, e.g. sparse reach, prefer the dense variant).

The weights are loaded on the first step, on the control loop's thread; the file is checked
when the reward is made, so a missing file fails at start-up, not mid-run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
from pydantic import Field, field_validator, model_validator

from user_rl.config_plugins import RewardSettings
from user_rl.rewards.base import RewardedStep
from user_rl.rewards.model import (
    ClassifierFileError,
    SuccessClassifier,
    check_fits,
    load_classifier,
    observation_subspace,
)
from user_rl.wire import user_rl_pb2 as pb


class ClassifierSettings(RewardSettings):
    """`reward.type: classifier`: 1 where a learned success classifier judges the observation a
    success (which ends the episode), else 0."""

    type: str = "classifier"
    classifier: str | None = Field(None, description="the file `user-rl reward train` wrote")
    threshold: float = Field(0.5, gt=0.0, lt=1.0, description="P(success) from which a step is a success")
    keys: list[str] | None = Field(None, description="observation keys it reads (default: those it was trained on)")

    @field_validator("classifier")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        """Edges may run in another working directory (Ray workers): the path is fixed where the config is read."""
        return None if value is None else str(Path(value).expanduser().resolve())

    @model_validator(mode="after")
    def _needs_a_classifier(self) -> ClassifierSettings:
        if self.classifier is None:
            raise ValueError("reward.classifier: reward.type classifier needs the classifier file's path")
        return self


class ClassifierReward:
    name = "classifier"
    Settings = ClassifierSettings

    def __init__(
        self,
        observation_space: gym.spaces.Dict,
        classifier: str | Path,
        threshold: float = 0.5,
        keys: list[str] | None = None,
    ) -> None:
        self.path = Path(classifier)
        if not self.path.is_file():
            raise ClassifierFileError(
                f"reward.classifier: no classifier file at {self.path} (make one with "
                "`user-rl reward train RUN_DIR --out FILE`)"
            )
        if keys is not None:
            observation_subspace(observation_space, keys)  # a clear error for a key the robot lacks
        self.keys = keys
        self.threshold = threshold
        self.observation_space = observation_space
        self._model: SuccessClassifier | None = None
        self.judged_successes = 0

    @property
    def model(self) -> SuccessClassifier:
        if self._model is None:
            model = load_classifier(self.path)
            check_fits(model, self.observation_space, self.path)
            if self.keys is not None and sorted(self.keys) != model.keys:
                raise ClassifierFileError(f"reward.keys: {self.path} reads {model.keys}, not {sorted(self.keys)}")
            self._model = model
        return self._model

    def judge(self, obs: dict[str, np.ndarray]) -> bool:
        """True where the classifier sees the task done in this one observation."""
        model = self.model
        p = model.probability({k: np.asarray(obs[k])[None] for k in model.keys})[0]
        return bool(p >= self.threshold)

    def __call__(self, next_obs: dict[str, np.ndarray], env_step: RewardedStep) -> RewardedStep:
        if env_step.label != pb.LABEL_NONE and env_step.label_by == pb.LABEL_BY_PERSON:
            return replace(env_step, reward=float(env_step.label == pb.LABEL_SUCCESS))
        if self.judge(next_obs):
            self.judged_successes += 1
            return RewardedStep(1.0, True, False, pb.LABEL_SUCCESS, pb.LABEL_BY_CLASSIFIER)
        ended = env_step.terminated or env_step.truncated
        return RewardedStep(
            0.0,
            env_step.terminated,
            env_step.truncated,
            pb.LABEL_FAILURE if ended else pb.LABEL_NONE,
            pb.LABEL_BY_CLASSIFIER,
        )
