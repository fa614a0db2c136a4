"""Train a success classifier on a buffer's labelled frames and measure it on held-out episodes.

Whole episodes are held out (`holdout` of them), so frames of one episode are never on both
sides. Batches draw successes and failures in equal numbers, since a success episode gives one
or a few positive frames against many negatives. Accuracy is reported overall and per class.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from user_rl.algos.optim import adam
from user_rl.rewards.frames import LabelledFrames, labelled_frames
from user_rl.rewards.model import SuccessClassifier, box_space, save_classifier


@dataclass
class TrainResult:
    frames: int  # training frames
    held_out: int  # held-out frames
    accuracy: float  # on the held-out frames
    success_recall: float  # held-out success frames judged success
    failure_recall: float  # held-out failure frames judged failure
    path: Path | None = None

    def line(self) -> str:
        return (
            f"held-out accuracy {self.accuracy:.3f} on {self.held_out} frames (success recall "
            f"{self.success_recall:.3f}, failure recall {self.failure_recall:.3f}); trained on {self.frames} frames"
        )


def split_episodes(frames: LabelledFrames, holdout: float, seed: int) -> tuple[LabelledFrames, LabelledFrames]:
    """(train, held-out): a `holdout` share of the labelled episodes, both classes on each side where possible."""
    rng = np.random.default_rng(seed)
    held: list[int] = []
    won = np.unique(frames.episode[frames.success])
    for episodes in (won, np.setdiff1d(np.unique(frames.episode), won)):  # each class gives its share
        episodes = episodes.copy()
        rng.shuffle(episodes)
        if len(episodes) > 1:
            held += episodes[: max(1, round(holdout * len(episodes)))].tolist()
    test = np.isin(frames.episode, held)
    return frames.take(np.flatnonzero(~test)), frames.take(np.flatnonzero(test))


def evaluate(
    model: SuccessClassifier, frames: LabelledFrames, threshold: float = 0.5, chunk: int = 512
) -> tuple[float, float, float]:
    """(accuracy, success recall, failure recall) of the judgement P >= threshold."""
    model.eval()
    judged = np.concatenate(
        [
            model.probability({k: v[i : i + chunk] for k, v in frames.obs.items()}) >= threshold
            for i in range(0, len(frames), chunk)
        ]
    )
    truth = frames.success
    return (
        float((judged == truth).mean()),
        float(judged[truth].mean()) if truth.any() else float("nan"),
        float((~judged[~truth]).mean()) if (~truth).any() else float("nan"),
    )


def fit(
    frames: LabelledFrames,
    space: gym.spaces.Dict,
    updates: int = 1500,
    batch_size: int = 128,
    lr: float = 1e-3,
    hidden: list[int] | None = None,
    seed: int = 0,
) -> SuccessClassifier:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = SuccessClassifier(space, hidden)
    model.fit_normaliser(frames.obs)
    optim = adam(model.parameters(), lr)
    pos, neg = np.flatnonzero(frames.success), np.flatnonzero(~frames.success)
    model.train()
    for _ in range(updates):
        rows = np.concatenate([rng.choice(pos, batch_size // 2), rng.choice(neg, batch_size - batch_size // 2)])
        batch = {k: torch.as_tensor(v[rows]) for k, v in frames.obs.items()}
        loss = F.binary_cross_entropy_with_logits(
            model(batch), torch.as_tensor(frames.success[rows], dtype=torch.float32)
        )
        optim.zero_grad()
        loss.backward()
        optim.step()
    return model.eval()


def train_classifier(
    path: str | Path,
    keys: list[str],
    out: str | Path | None = None,
    positives: int = 1,
    holdout: float = 0.2,
    updates: int = 1500,
    threshold: float = 0.5,
    seed: int = 0,
    hidden: list[int] | None = None,
) -> TrainResult:
    """Train on the labelled frames of the run or buffer at `path`; save to `out` (weights only)."""
    frames = labelled_frames(path, keys, positives)
    space = gym.spaces.Dict({k: box_space(list(v.shape[1:]), str(v.dtype)) for k, v in frames.obs.items()})
    train, test = split_episodes(frames, holdout, seed)
    model = fit(train, space, updates=updates, hidden=hidden, seed=seed)
    accuracy, success_recall, failure_recall = evaluate(model, test, threshold) if len(test) else (float("nan"),) * 3
    result = TrainResult(len(train), len(test), accuracy, success_recall, failure_recall)
    if out is not None:
        result.path = save_classifier(
            model, out, {"accuracy": accuracy, "success_recall": success_recall, "failure_recall": failure_recall}
        )
    return result
