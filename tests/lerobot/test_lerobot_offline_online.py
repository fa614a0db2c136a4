"""Offline then online, from a LeRobot dataset: what a lab with recorded demonstrations does first.

Demonstrations come from a short run in which the scripted expert (a stand-in for a person) takes
over; they are exported as a LeRobotDataset and imported back as a buffer, as a dataset recorded
anywhere would be. `user-rl train` with `fleet.num_robots: 0` then trains behaviour cloning on that
buffer alone (no robot, no env step) until `stop.max_updates`, and the same run directory goes on
online with robots (`resume=`). A paced fleet's budget of updates counts online env steps past
`algo.learning_starts`, so the offline updates must not make the online learner wait.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.e2e.harness import train
from tests.lerobot.harness import user_rl_in_lerobot
from user_rl.cloud.buffer.episodes import read_episodes
from user_rl.wire import user_rl_pb2 as pb

CONFIG = "configs/reach_hg_dagger.yaml"
QUIET = ("stop.eval_every_s=null", "stop.success_rate=null", "stop.eval_episodes=5")
OFFLINE_UPDATES = 400
ONLINE = ("fleet.num_robots=2", "stop.max_env_steps=800", "algo.learning_starts=200", "algo.utd_ratio=1")


def metrics_lines(run_dir: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if line.get("metrics")]


def test_a_run_learns_offline_from_an_imported_dataset_then_goes_on_online(lerobot_python: Path, tmp_path: Path):
    demos = train(CONFIG, tmp_path / "demos", "fleet.num_robots=2", "stop.max_env_steps=1500", *QUIET, timeout=600)
    exported, imported = tmp_path / "dataset", tmp_path / "imported"
    user_rl_in_lerobot(lerobot_python, "buffer", "export", f"{demos['run_dir']}/buffer", str(exported), "--fps", "20")
    user_rl_in_lerobot(lerobot_python, "buffer", "import", str(exported), str(imported))
    attach = f"buffer.attach=[{{path: {imported}, source: demo}}]"

    offline = train(
        CONFIG,
        tmp_path / "runs",
        "fleet.num_robots=0",
        attach,
        "buffer.mix={demo: 1.0}",
        f"stop.max_updates={OFFLINE_UPDATES}",
        "algo.learning_starts=256",
        *QUIET,
        timeout=600,
    )
    run_dir = Path(offline["run_dir"])
    assert offline["stop_reason"] == "max_updates", offline["stdout"][-2000:]
    assert offline["learner"]["updates"] == OFFLINE_UPDATES and offline["learner"]["env_steps"] == 0
    assert offline["edges"] == {} and offline["evaluations"] == []
    assert "offline on the attached buffers" in offline["stdout"]
    # It imitated the demonstrations with no robot at all. On seeds 0-9 of the offline run on one
    # imported dataset: an untrained actor's loss on them was 91-213 and its squared distance to the
    # demonstrated actions 1.97-2.41; after 400 updates 7.2-8.0 and 1.30-1.70. (The first metrics the
    # run reports may come after some updates already, so the bars are absolute, not relative to it.)
    last = metrics_lines(run_dir)[-1]["metrics"]
    assert last["bc_loss"] < 15.0 and last["action_mse"] < 1.9, last

    online = train(CONFIG, tmp_path / "runs", f"resume={run_dir}", attach, *ONLINE, *QUIET, timeout=600)
    learner = online["learner"]
    assert Path(online["run_dir"]) == run_dir and online["stop_reason"] == "max_env_steps"
    assert learner["resumed_from"]["updates"] == OFFLINE_UPDATES
    # The online budget counts online steps: the offline updates did not hold the learner back. A paced
    # robot may run a batch (32 steps) past the learner, so the run can stop up to 2 x 32 updates short
    # of env steps - learning_starts (572 of 600 once on a loaded box); counting the offline updates in
    # the budget would leave it 400 short.
    online_updates = learner["updates"] - OFFLINE_UPDATES
    slack = 2 * 32  # fleet.num_robots x the config's fleet.batch_transitions
    assert online_updates >= learner["env_steps"] - 200 - slack, (learner["updates"], learner["env_steps"])
    # The robots acted with the offline policy from the start, not with random warm-up actions.
    steps = [e.steps for e in read_episodes(run_dir / "buffer")]
    policy_rows = np.concatenate([s["policy_version"][s["actor"] == pb.ACTOR_POLICY] for s in steps])
    warm_up = int((policy_rows < 0).sum())
    assert warm_up <= 2 * 32, f"{warm_up} random warm-up steps after an offline start"
