"""The `labels` reward and the reward section's errors."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tests.rewards.recording import record_run
from user_rl.cli import main
from user_rl.cloud.buffer.rows import KIND_RECORD
from user_rl.cloud.buffer.segment import read_segment
from user_rl.cloud.learner import Learner
from user_rl.config import ConfigError, build_config
from user_rl.edge.factory import make_edge
from user_rl.rewards.frames import NoLabelledFrames, labelled_frames
from user_rl.rewards.model import ClassifierFileError
from user_rl.testing.wait import wait_until
from user_rl.wire import user_rl_pb2 as pb


def test_a_persons_success_mark_is_the_only_reward_with_labels(tmp_path: Path) -> None:
    # The env's dense reward (minus the distance) is never 0 or 1: none of it may reach the buffer.
    cfg = build_config(
        {"robot": {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 100}}},
        [
            "fleet.num_robots=1",
            "algo.learning_starts=100000",
            "fleet.batch_transitions=8",
            "fleet.pace_to_learner=false",
            "fleet.control_hz=50",
            "reward.type=labels",
        ],
    )
    learner = Learner(cfg, tmp_path)
    learner_thread = threading.Thread(target=learner.run, daemon=True)
    learner_thread.start()
    edge = make_edge(cfg, 0, learner.addresses["data"], learner.addresses["weights"])
    edge_thread = threading.Thread(target=edge.run, daemon=True)
    edge_thread.start()
    try:
        wait_until(lambda: edge.steps >= 20, 60, "steps")
        episode = edge.episodes
        edge.requests.mark(success=True)
        wait_until(lambda: edge.episodes > episode, 10, "the marked episode to end")
        wait_until(lambda: edge.steps >= 60, 60, "more steps")
        edge.stop()
        edge_thread.join(30)
        assert edge.detach(30)
        learner.stop()
        learner_thread.join(30)
        learner.close()  # seals the buffer: read back what the learner stored, from its files
        segments = [read_segment(f).columns for f in sorted((tmp_path / "buffer").glob("seg-*.seg"))]
        flat = {k: np.concatenate([c[k] for c in segments]) for k in ("kind", "reward", "label", "label_by", "episode")}
        records = np.flatnonzero(flat["kind"] == KIND_RECORD)
        reward, label = flat["reward"][records], flat["label"][records]
        assert len(records) >= 60
        marked = np.flatnonzero((flat["episode"][records] == episode) & (label == pb.LABEL_SUCCESS))
        assert len(marked) == 1 and flat["label_by"][records[marked[0]]] == pb.LABEL_BY_PERSON
        assert reward[marked[0]] == 1.0
        # Every other row: 0 (the random policy touches no target in 100 steps), never the env's reward.
        others = np.delete(np.arange(len(records)), marked)
        assert (reward[others] == 0.0).all()
        print(f"\n{len(records)} rows: reward 1 on the marked row, 0 on the {len(others)} others")
    finally:
        edge.stop()
        edge_thread.join(10)
        edge.close()
        learner.stop()
        learner_thread.join(30)
        learner.close()


def test_reward_config_errors_name_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="reward.classifier: reward.type classifier needs the classifier file's path"):
        build_config({}, ["reward.type=classifier"])
    with pytest.raises(
        ConfigError, match="reward.keys is a setting of reward.type classifier; this reward's type is labels"
    ):
        build_config({}, ["reward.type=labels", "reward.keys=[image]"])
    with pytest.raises(ConfigError, match="reward.type"):
        build_config({}, ["reward.type=magic"])
    cfg = build_config({}, ["reward.type=classifier", f"reward.classifier={tmp_path / 'missing.pt'}"])
    with pytest.raises(ClassifierFileError, match="no classifier file at .*missing.pt"):
        make_edge(cfg, 0, "tcp://127.0.0.1:1", "tcp://127.0.0.1:2")


def test_a_buffer_without_labels_gives_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # 30 steps of a 100-step episode: no episode ended, so no row carries a label.
    record_run(
        tmp_path / "run",
        {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 100}},
        ["algo.learning_starts=1000000000"],
        30,
    )
    with pytest.raises(NoLabelledFrames, match="no labelled episodes"):
        labelled_frames(tmp_path / "run", ["state"])
    assert main(["reward", "train", str(tmp_path / "run"), "--keys", "state", "--out", str(tmp_path / "c.pt")]) == 2
    assert "no labelled episodes" in capsys.readouterr().err and not (tmp_path / "c.pt").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoLabelledFrames, match="no sealed buffer segments"):
        labelled_frames(tmp_path / "empty", ["state"])
