"""Buffer -> LeRobotDataset v3 -> LeRobot's own loader -> our import, on real files.

The buffer is written the way the ingest writes it (`PersistentReplay`, small segments so
episodes cross them); `user-rl buffer export` and `buffer import` run in the LeRobot environment,
and LeRobot's `LeRobotDataset` reads the export there. Observations (a camera and a state),
actions, rewards, terminated vs truncated, final observations, who acted, labels, and the
policy's proposals must all come back equal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from tests.lerobot.harness import record_with_lerobot, run_in_lerobot
from user_rl.cloud.buffer.episodes import EpisodeFilter, buffer_spaces, read_episodes
from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.config import BufferConfig
from user_rl.edge.batching import BatchBuilder
from user_rl.extras import LEROBOT_ENV_COMMAND
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import ACTOR_PERSON, PERSON_COLUMNS

OBS_SPACE = gym.spaces.Dict(
    {"top": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), "state": gym.spaces.Box(-10.0, 10.0, (3,), np.float32)}
)
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ROBOTS = {"arm-0": "touch the red target", "arm-1": "touch the green target"}
SO101_JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
EPISODES = 4  # per robot: terminated, truncated, terminated, and one still running (no final observation)


def observation(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"top": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "state": rng.uniform(-10, 10, 3).astype(np.float32)}


def write_buffer(
    directory: Path, obs_space: gym.spaces.Dict = OBS_SPACE, observe: Callable = observation, segment_mb: float = 0.01
) -> None:
    """Two robots, 4 episodes each; a person takes over in some steps of odd episodes (holding
    nothing in some of them; alice on arm-0, bob on arm-1) and carol labels the successes; steps
    carry the robot's timestamps at 20 Hz."""
    rng = np.random.default_rng(0)
    store = PersistentReplay(directory, obs_space, ACTION_SPACE, BufferConfig(segment_mb=segment_mb), gamma=0.9)
    try:
        for robot, task in ROBOTS.items():
            stream = store.open_stream(robot, 1, task, control_hz=20.0)
            for episode in range(EPISODES):
                length = 7 + 3 * episode
                builder = BatchBuilder(obs_space, ACTION_SPACE, capacity=length)
                for step in range(length):
                    last = step == length - 1 and episode < EPISODES - 1
                    terminated, truncated = last and episode != 1, last and episode == 1
                    person = episode % 2 == 1 and step >= 2
                    proposal = rng.uniform(-1, 1, 2).astype(np.float32)
                    builder.add(
                        observe(rng),
                        rng.uniform(-1, 1, 2).astype(np.float32) if person else proposal,
                        float(rng.normal()),
                        terminated,
                        truncated,
                        episode=episode,
                        step=step,
                        policy_version=episode * 3,
                        actor=pb.ACTOR_HUMAN if person else pb.ACTOR_POLICY,
                        label=pb.LABEL_SUCCESS if terminated else pb.LABEL_NONE,
                        label_by=pb.LABEL_BY_PERSON if terminated else pb.LABEL_BY_ENV,
                        sensor_time=100.0 + 0.05 * step,
                        policy_action=proposal,
                        final_obs=observe(rng) if last else None,
                        idle=person and step % 3 == 0,  # the person held nothing then
                        person=("alice" if robot == "arm-0" else "bob") if person else "",
                        label_person="carol" if terminated else "",
                    )
                taken = builder.take_batch()
                assert store.add(stream, episode + 1, taken.columns, taken.people)
                store.commit()
    finally:
        store.close()


def assert_same_episodes(ours: list, theirs: list) -> None:
    assert [(e.robot, e.number, e.task, len(e), e.status) for e in ours] == [
        (e.robot, e.number, e.task, len(e), e.status) for e in theirs
    ]
    for a, b in zip(ours, theirs):
        for name, column in a.steps.items():
            if name in PERSON_COLUMNS:  # ids of each buffer's own people: the same names
                names = [a.people.get(int(i), "") for i in column]
                assert names == [b.people.get(int(i), "") for i in b.steps[name]], f"{a.robot} {a.number}: {name}"
                continue
            np.testing.assert_array_equal(column, b.steps[name], err_msg=f"{a.robot} episode {a.number}: {name}")
        assert (a.final_obs is None) == (b.final_obs is None)
        for key in a.final_obs or {}:
            np.testing.assert_array_equal(a.final_obs[key], b.final_obs[key])


LOAD_WITH_LEROBOT = """
import json, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
dataset = LeRobotDataset("local/user-rl", root=sys.argv[1])
frames = [dataset[i] for i in range(len(dataset))]
out = {name: np.stack([np.asarray(f[name]) for f in frames]) for name in frames[0] if name != "task"}
np.savez(sys.argv[2], **out)
print(json.dumps({"episodes": dataset.meta.total_episodes, "fps": dataset.meta.fps,
                  "tasks": [f["task"] for f in frames], "features": sorted(dataset.features)}))
"""


def test_a_buffer_round_trips_through_lerobots_own_loader(lerobot_python: Path, tmp_path: Path) -> None:
    write_buffer(tmp_path / "buffer")
    original = list(read_episodes(tmp_path / "buffer"))
    assert len(original) == 2 * EPISODES and sum(e.final_obs is not None for e in original) == 2 * (EPISODES - 1)

    exported = run_in_lerobot(
        lerobot_python,
        "-m",
        "user_rl.cli",
        "buffer",
        "export",
        str(tmp_path / "buffer"),
        str(tmp_path / "dataset"),
        "--robot-type",
        "so101_follower",
    )
    assert f"wrote {2 * EPISODES} episodes" in exported.stdout and "20 fps" in exported.stdout, exported.stdout
    assert f"exported: {2 * EPISODES}/{2 * EPISODES} episodes" in exported.stderr

    # LeRobot's own loader sees our data under its column names.
    loaded = json.loads(
        run_in_lerobot(lerobot_python, "-c", LOAD_WITH_LEROBOT, str(tmp_path / "dataset"), str(tmp_path / "frames.npz"))
        .stdout.strip()
        .splitlines()[-1]
    )
    frames = np.load(tmp_path / "frames.npz")
    assert loaded["episodes"] == 2 * EPISODES and loaded["fps"] == 20
    assert {
        "observation.state",
        "observation.images.top",
        "action",
        "next.reward",
        "next.done",
        "complementary_info.is_intervention",
        "user_rl.terminated",
        "user_rl.truncated",
    } <= set(loaded["features"])
    steps = {name: np.concatenate([e.steps[name] for e in original]) for name in original[0].steps}
    assert loaded["tasks"] == [e.task for e in original for _ in range(len(e))]
    np.testing.assert_array_equal(frames["observation.state"], steps["obs/state"])
    images = np.rint(frames["observation.images.top"].transpose(0, 2, 3, 1) * 255).astype(np.uint8)
    np.testing.assert_array_equal(images, steps["obs/top"])  # PNG: lossless
    np.testing.assert_array_equal(frames["action"], steps["action"])
    np.testing.assert_allclose(frames["next.reward"].reshape(-1), steps["reward"])
    np.testing.assert_array_equal(frames["next.done"].reshape(-1), steps["terminated"] | steps["truncated"])
    np.testing.assert_array_equal(
        frames["complementary_info.is_intervention"].reshape(-1), steps["actor"] == pb.ACTOR_HUMAN
    )
    assert frames["episode_index"].max() == 2 * EPISODES - 1

    # Who acted and labelled by name: an id per frame, the names in the sidecar.
    people = json.loads((tmp_path / "dataset" / "meta" / "user_rl.json").read_text())["people"]
    assert sorted(people.values()) == ["alice", "bob", "carol"]
    acted_by = [people.get(str(int(i)), "") for i in frames["user_rl." + ACTOR_PERSON].reshape(-1)]
    assert acted_by == [original[0].people.get(int(i), "") for i in steps[ACTOR_PERSON]]
    assert {"alice", "bob", ""} == set(acted_by)
    # ... and our import gives back the same episodes, down to the flags, names and the final observations.
    imported = run_in_lerobot(
        lerobot_python, "-m", "user_rl.cli", "buffer", "import", str(tmp_path / "dataset"), str(tmp_path / "imported")
    )
    assert "source: demo" in imported.stdout, imported.stdout
    back = list(read_episodes(tmp_path / "imported"))
    assert_same_episodes(original, back)


def test_an_export_takes_a_slice_of_robots_and_episodes_with_interventions(
    lerobot_python: Path, tmp_path: Path
) -> None:
    write_buffer(tmp_path / "buffer")
    run_in_lerobot(
        lerobot_python,
        "-m",
        "user_rl.cli",
        "buffer",
        "export",
        str(tmp_path / "buffer"),
        str(tmp_path / "dataset"),
        "--robot",
        "arm-1",
        "--with-interventions",
        "--fps",
        "10",
    )
    run_in_lerobot(
        lerobot_python, "-m", "user_rl.cli", "buffer", "import", str(tmp_path / "dataset"), str(tmp_path / "imported")
    )
    wanted = list(read_episodes(tmp_path / "buffer", EpisodeFilter(robots=["arm-1"], with_interventions=True)))
    assert [e.number for e in wanted] == [1, 3] and all(e.interventions for e in wanted)
    assert_same_episodes(wanted, list(read_episodes(tmp_path / "imported")))

    again = subprocess.run(
        [
            str(lerobot_python),
            "-m",
            "user_rl.cli",
            "buffer",
            "export",
            str(tmp_path / "buffer"),
            str(tmp_path / "dataset"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 2 and "exists; LeRobot writes a new dataset directory" in again.stderr, again.stderr
    none = subprocess.run(
        [
            str(lerobot_python),
            "-m",
            "user_rl.cli",
            "buffer",
            "export",
            str(tmp_path / "buffer"),
            str(tmp_path / "empty"),
            "--task",
            "fold the towel",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert none.returncode == 2 and "no episode matches" in none.stderr, none.stderr


def test_without_lerobot_the_export_says_how_to_get_it(tmp_path: Path) -> None:
    # The main environment has no LeRobot (its torch pin keeps it in an environment of its own).
    write_buffer(tmp_path / "buffer")
    done = subprocess.run(
        [sys.executable, "-m", "user_rl.cli", "buffer", "export", str(tmp_path / "buffer"), str(tmp_path / "dataset")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and LEROBOT_ENV_COMMAND in done.stderr, done.stderr
    assert not (tmp_path / "dataset").exists()


def test_a_dataset_recorded_by_lerobot_itself_imports_as_a_persons_demonstrations(
    lerobot_python: Path, tmp_path: Path
) -> None:
    noise = np.random.default_rng(1).integers(0, 256, (21, 8, 8, 3), dtype=np.uint8)
    recorded = record_with_lerobot(
        lerobot_python, tmp_path / "dataset", noise, [(12, "pick the cube"), (9, "place the cube")], SO101_JOINTS
    )
    imported = run_in_lerobot(
        lerobot_python, "-m", "user_rl.cli", "buffer", "import", str(tmp_path / "dataset"), str(tmp_path / "buffer")
    )
    assert "source: demo" in imported.stdout, imported.stdout
    episodes = list(read_episodes(tmp_path / "buffer"))
    assert [(e.task, len(e)) for e in episodes] == [("pick the cube", 12), ("place the cube", 9)]
    steps = {name: np.concatenate([e.steps[name] for e in episodes]) for name in episodes[0].steps}
    np.testing.assert_array_equal(steps["obs/state"], recorded["state"])
    np.testing.assert_array_equal(steps["obs/front"], recorded["front"])  # stored as PNG by LeRobot: lossless
    np.testing.assert_array_equal(steps["action"], recorded["action"])
    assert (steps["actor"] == pb.ACTOR_HUMAN).all()  # LeRobot records a person teleoperating
    # No next.done: a recording that stopped on a timer is not the task's end (its value is bootstrapped).
    assert [e.status for e in episodes] == ["truncated", "truncated"] and not steps["terminated"].any()
    assert "each episode's end is imported as truncated" in imported.stderr
    obs_space, action_space = buffer_spaces(tmp_path / "buffer")
    assert set(obs_space.spaces) == {"state", "front"} and obs_space["front"].dtype == np.uint8
    assert (action_space.low <= recorded["action"].min(0)).all() and (
        action_space.high >= recorded["action"].max(0)
    ).all()


# -- episode identity: (robot, epoch, episode) -------------------------------------------------------


def restart_batch(rng: np.random.Generator, episode: int, steps: range, end: str, clock: float) -> dict:
    """Steps `steps` of one episode as one batch; `end` is how its last step ends it: terminated,
    or nothing (the episode goes on, or the edge dies and cuts it)."""
    builder = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=len(steps))
    for step in steps:
        terminated = end == "terminated" and step == steps[-1]
        action = rng.uniform(-1, 1, 2).astype(np.float32)
        builder.add(
            observation(rng),
            action,
            float(rng.normal()),
            terminated,
            False,
            episode=episode,
            step=step,
            policy_version=step,
            actor=pb.ACTOR_POLICY,
            label=pb.LABEL_NONE,
            label_by=pb.LABEL_BY_ENV,
            sensor_time=clock + 0.05 * step,
            policy_action=action,
            final_obs=observation(rng) if terminated else None,
        )
    return builder.take()[1]


def write_buffer_with_an_edge_restart(directory: Path) -> None:
    """arm-0's edge dies in its epoch 1 episode 1 and comes back as epoch 2, numbering episodes from
    0 again; arm-1 runs on. Episodes span batches, and the robots' batches interleave in segments."""
    rng = np.random.default_rng(1)
    store = PersistentReplay(directory, OBS_SPACE, ACTION_SPACE, BufferConfig(segment_mb=0.01), gamma=0.9)
    try:
        arm0 = store.open_stream("arm-0", 1, ROBOTS["arm-0"], control_hz=20.0)
        arm1 = store.open_stream("arm-1", 1, ROBOTS["arm-1"], control_hz=20.0)
        plan = [
            (arm0, 0, range(0, 4), "", 100.0),
            (arm1, 0, range(0, 5), "", 200.0),
            (arm0, 0, range(4, 8), "terminated", 100.0),
            (arm1, 0, range(5, 9), "terminated", 200.0),
            (arm0, 1, range(0, 5), "", 110.0),
            (arm1, 1, range(0, 3), "", 210.0),
        ]
        for stream, episode, steps, end, clock in plan:  # then arm-0's edge dies in its episode 1
            assert store.add(
                stream,
                store.last_seq(stream.record.robot, stream.record.epoch) + 1,
                restart_batch(rng, episode, steps, end, clock),
            )
            store.commit()
        arm0 = store.open_stream("arm-0", 2, ROBOTS["arm-0"], control_hz=20.0)  # the same robot, a new edge life
        for stream, episode, steps, end, clock in [
            (arm0, 0, range(0, 6), "", 300.0),
            (arm1, 1, range(3, 7), "", 210.0),
            (arm0, 0, range(6, 10), "terminated", 300.0),
            (arm0, 1, range(0, 3), "", 310.0),
        ]:
            assert store.add(
                stream,
                store.last_seq(stream.record.robot, stream.record.epoch) + 1,
                restart_batch(rng, episode, steps, end, clock),
            )
            store.commit()
    finally:
        store.close()


def identities(episodes: list) -> list[tuple]:
    return sorted((e.robot, e.epoch, e.number, len(e), e.status, e.end_reason) for e in episodes)


LOAD_AND_IMPORT = """
import json, shutil, sys
from pathlib import Path
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from user_rl.datasets.lerobot_import import import_lerobot
root, work = Path(sys.argv[1]), Path(sys.argv[2])
dataset = LeRobotDataset("local/user-rl", root=root)  # still a dataset LeRobot loads, frame by frame
bounds = [(int(e["dataset_from_index"]), int(e["dataset_to_index"])) for e in dataset.meta.episodes]
episode_index = [int(dataset[i]["episode_index"]) for i in range(len(dataset))]
import_lerobot(root, work / "imported")  # what `user-rl buffer import` runs
# an export written before epochs were kept: its sidecar names (robot, episode) only
old = work / "old-export"
shutil.copytree(root, old)
sidecar = json.loads((old / "meta/user_rl.json").read_text())
sidecar["episodes"] = [{"robot": o["robot"], "episode": o["episode"]} for o in sidecar["episodes"]]
(old / "meta/user_rl.json").write_text(json.dumps(sidecar))
import_lerobot(old, work / "imported-old")
# a sidecar that does not describe the dataset is refused, naming why
sidecar["episodes"] = sidecar["episodes"][:-1]
(old / "meta/user_rl.json").write_text(json.dumps(sidecar))
try:
    import_lerobot(old, work / "imported-bad")
    refused = ""
except Exception as exc:
    refused = f"{type(exc).__name__}: {exc}"
print(json.dumps({"episodes": dataset.meta.total_episodes, "bounds": bounds, "episode_index": episode_index,
                  "refused": refused}))
"""


def test_episodes_keep_their_epoch_through_export_and_import(lerobot_python: Path, tmp_path: Path) -> None:
    """Episode numbers restart at 0 after an edge restart: the export says which epoch each
    episode is, and the import gives back the same episodes, not two episodes 0 merged into one."""
    write_buffer_with_an_edge_restart(tmp_path / "buffer")
    original = list(read_episodes(tmp_path / "buffer"))
    assert sorted((e.robot, e.epoch, e.number) for e in original) == [
        ("arm-0", 1, 0),
        ("arm-0", 1, 1),
        ("arm-0", 2, 0),
        ("arm-0", 2, 1),
        ("arm-1", 1, 0),
        ("arm-1", 1, 1),
    ]

    run_in_lerobot(
        lerobot_python, "-m", "user_rl.cli", "buffer", "export", str(tmp_path / "buffer"), str(tmp_path / "dataset")
    )
    loaded = json.loads(
        run_in_lerobot(lerobot_python, "-c", LOAD_AND_IMPORT, str(tmp_path / "dataset"), str(tmp_path))
        .stdout.strip()
        .splitlines()[-1]
    )

    # LeRobot loads the export: one dataset episode per buffer episode, each frame in its episode.
    lengths = [stop - start for start, stop in loaded["bounds"]]
    assert loaded["episodes"] == len(original) and sorted(lengths) == sorted(len(e) for e in original)
    assert loaded["episode_index"] == [n for n, length in enumerate(lengths) for _ in range(length)]
    # The round trip gives the same episodes, rows in step order, the cut one still cut.
    back = list(read_episodes(tmp_path / "imported"))
    assert identities(back) == identities(original)
    key = lambda e: (e.robot, e.epoch, e.number)  # noqa: E731
    assert_same_episodes(sorted(original, key=key), sorted(back, key=key))
    for episode in back:
        np.testing.assert_array_equal(episode.steps["step"], np.arange(len(episode)))
    # An export from before epochs were kept still never merges two episodes (a repeated number is a new epoch).
    old = list(read_episodes(tmp_path / "imported-old"))
    assert sorted((e.robot, e.number, len(e)) for e in old) == sorted((e.robot, e.number, len(e)) for e in original)
    assert "ValueError" in loaded["refused"] and "names 5 episodes but the dataset has 6" in loaded["refused"], loaded[
        "refused"
    ]


def write_format_1_buffer(directory: Path) -> None:
    """The buffer tests/lerobot/fixtures/export-format-1 was exported from (with the export of before
    format 2): one robot, a 4x4 camera and two joints, a terminated and a truncated episode."""
    obs_space = gym.spaces.Dict(
        {"top": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8), "joints": gym.spaces.Box(-2.0, 2.0, (2,), np.float32)}
    )
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    rng = np.random.default_rng(7)

    def observation() -> dict[str, np.ndarray]:
        top = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
        return {"top": top, "joints": rng.uniform(-2, 2, 2).astype(np.float32)}

    store = PersistentReplay(directory, obs_space, action_space, BufferConfig(), gamma=0.9)
    try:
        stream = store.open_stream("arm-0", 1, "reach", control_hz=20.0)
        for episode in range(2):
            builder = BatchBuilder(obs_space, action_space, capacity=5)
            for step in range(5):
                last = step == 4
                obs = observation()
                final = observation() if last else None
                builder.add(
                    obs,
                    rng.uniform(-1, 1, 2).astype(np.float32),
                    float(last),
                    last and episode == 0,
                    last and episode == 1,
                    episode=episode,
                    step=step,
                    policy_version=episode,
                    actor=pb.ACTOR_HUMAN if step > 2 else pb.ACTOR_POLICY,
                    label=pb.LABEL_NONE,
                    label_by=0,
                    sensor_time=5.0 + 0.05 * step,
                    policy_action=np.zeros(2, np.float32),
                    final_obs=final,
                )
            store.add(stream, episode + 1, builder.take()[1])
            store.commit()
    finally:
        store.close()


def test_an_export_written_before_format_2_imports_unchanged(lerobot_python: Path, tmp_path: Path) -> None:
    """Exports from before LeRobot could train on them (a column per observation key, final
    observations as image features) still import exactly."""
    fixture = Path(__file__).parent / "fixtures" / "export-format-1"
    assert "format" not in json.loads((fixture / "meta" / "user_rl.json").read_text())
    write_format_1_buffer(tmp_path / "original")
    run_in_lerobot(lerobot_python, "-m", "user_rl.cli", "buffer", "import", str(fixture), str(tmp_path / "imported"))
    assert_same_episodes(list(read_episodes(tmp_path / "original")), list(read_episodes(tmp_path / "imported")))


def test_an_exports_fps_is_the_robots_control_rate_or_must_be_given(tmp_path: Path) -> None:
    """Not a guess from timestamps (a sim without a clock gave 381 fps): the rate each robot's hello
    declared, as the buffer recorded it; `--fps` where it has none, or where robots differ."""
    from user_rl.datasets.lerobot import export_fps

    rng = np.random.default_rng(0)
    store = PersistentReplay(tmp_path / "buffer", OBS_SPACE, ACTION_SPACE, BufferConfig(), gamma=0.9)
    try:
        for robot, hz, clock in (("arm-0", 20.0, 100.0), ("arm-1", 10.0, 200.0), ("sim-0", 0.0, 300.0)):
            stream = store.open_stream(robot, 1, "reach", control_hz=hz)
            assert store.add(stream, 1, restart_batch(rng, 0, range(0, 4), "terminated", clock))
            store.commit()
    finally:
        store.close()
    assert export_fps(tmp_path / "buffer", EpisodeFilter(robots=["arm-0"])) == 20
    with pytest.raises(ValueError, match=r"different rates \(arm-0 20 Hz, arm-1 10 Hz\).*export them apart"):
        export_fps(tmp_path / "buffer", EpisodeFilter(robots=["arm-0", "arm-1"]))
    with pytest.raises(ValueError, match="no control rate recorded for sim-0 .* frame rate with --fps"):
        export_fps(tmp_path / "buffer", None)
