"""A sim that emits one NaN observation keeps streaming: a `user-rl learner` process, an edge daemon
with a MuJoCo arm whose sensor glitches once, real sockets, the buffer and status read back."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

import numpy as np
import yaml

from tests.e2e.harness import learner_status, start_learner, stored
from user_rl.cli import main
from user_rl.cloud.buffer.episodes import read_episodes
from user_rl.cloud.buffer.inspect import inspect_buffer
from user_rl.cloud.quarantine import quarantine_file, read_quarantine
from user_rl.config import build_config
from user_rl.edge.factory import make_edge
from user_rl.testing.wait import free_port, wait_until

STEPS, GLITCH_AT = 240, 70  # the 71st step's observation is NaN: step 20 of episode 1 (50-step episodes)


def test_a_sim_that_emits_one_nan_observation_keeps_streaming(tmp_path: Path, capsys) -> None:
    data_port, weights_port = free_port(), free_port()
    cfg_dict = {
        "robot": {"type": "mujoco_reach", "options": {"obs_mode": "state", "episode_steps": 50}},
        "fleet": {"num_robots": 1, "pace_to_learner": False, "batch_transitions": 16},
        "policy": {"hidden": [16]},
        "algo": {"learning_starts": 10**6},
        "learner": {"data_port": data_port, "weights_port": weights_port, "torch_threads": 1},
    }
    config = tmp_path / "glitch.yaml"
    config.write_text(yaml.safe_dump(cfg_dict))
    run_dir = tmp_path / "run"
    with open(tmp_path / "learner.log", "ab") as log:
        learner = start_learner(config, run_dir, log)
        try:
            edge = make_edge(
                build_config(cfg_dict),
                0,
                f"tcp://127.0.0.1:{data_port}",
                f"tcp://127.0.0.1:{weights_port}",
                tmp_path / "spool",
            )
            robot_id, steps, resets = edge.robot.descriptor.id, [], []
            real_step, real_reset = edge.robot.step, edge.robot.reset

            def glitching_step(action: np.ndarray):
                result = real_step(action)
                steps.append(len(steps))
                if len(steps) == GLITCH_AT + 1:
                    state = result.observation["state"].copy()
                    state[3] = np.nan
                    result = dataclasses.replace(result, observation={**result.observation, "state": state})
                return result

            def glitching_reset(**kwargs):
                obs = real_reset(**kwargs)
                resets.append(len(steps))
                if resets.count(GLITCH_AT + 1) == 1 and resets[-1] == GLITCH_AT + 1:  # the reset after the glitch
                    obs = {**obs, "state": np.full_like(obs["state"], np.inf)}
                return obs

            edge.robot.step, edge.robot.reset = glitching_step, glitching_reset
            try:
                edge.run(max_steps=STEPS)
                assert edge.drain(60), edge.status()
            finally:
                edge.close()
            status = edge.status()
            # Two bad observations: the glitch, and the first reset after it (reset again, nothing sent of it).
            assert status["bad_observations"] == 2 and status["refused_batches"] == 1 and status["unacked_batches"] == 0
            assert resets.count(GLITCH_AT + 1) == 2
            wait_until(
                lambda: (learner_status(run_dir)["robots"].get(robot_id) or {}).get("transitions") == STEPS - 1,
                30,
                "the learner's status to show every step but the refused one",
            )
            row = learner_status(run_dir)["robots"][robot_id]
            assert row["quarantined_batches"] == 1 and learner_status(run_dir)["quarantine"]["batches"] == 1
            capsys.readouterr()
            assert main(["status", str(run_dir)]) == 0
            table = capsys.readouterr().out
        finally:
            learner.send_signal(signal.SIGTERM)
            learner.wait(120)
    # `user-rl status`: the robot's row counts one quarantined batch.
    header, line = table.splitlines()[1], next(x for x in table.splitlines() if x.startswith(robot_id))
    assert line[header.index("quarantined") :].split()[0] == "1", table

    # Every batch the edge made is stored once, the refused one included as a taken seq; every
    # step but the one whose next observation was NaN is stored.
    keys, records = stored(run_dir)
    assert sorted(keys) == [(robot_id, edge.link.epoch, seq) for seq in range(1, edge.link.seq + 1)]
    assert records == STEPS - 1
    ((record, kept),) = read_quarantine(quarantine_file(run_dir / "buffer" / "quarantine", robot_id))
    assert record["count"] == 1 and record["reason"] == "non_finite: final_obs/state holds NaN or inf"
    assert np.isnan(kept.arrays["final_obs/state"]).any() and kept.arrays["episode"].tolist() == [1]

    # The glitch ended its episode there (truncated, with the reason); the robot was reset and the
    # next episode ran on as usual.
    episodes = {e.number: e for e in read_episodes(run_dir / "buffer")}
    assert (episodes[1].status, episodes[1].end_reason, len(episodes[1])) == ("truncated", "bad_observation", 20)
    assert [len(episodes[n]) for n in (0, 2, 3)] == [50, 50, 50] and episodes[2].status == "truncated"
    assert sum(len(e) for e in episodes.values()) == STEPS - 1
    assert inspect_buffer(run_dir / "buffer")["corrupt"] == []
