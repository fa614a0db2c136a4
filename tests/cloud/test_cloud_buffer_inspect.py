"""`user-rl buffer inspect` on real buffers written by PersistentReplay: the counts match what
was written, corruption is found and named (exit 1), a missing buffer exits 2, and inspecting
never changes a byte of the directory, also while a learner is writing it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from user_rl.cloud.buffer.inspect import format_report, inspect_buffer
from user_rl.cloud.buffer.segment import ALIGNMENT, read_layout
from user_rl.cloud.buffer.store import PersistentReplay
from user_rl.config import BufferConfig
from user_rl.edge.batching import BatchBuilder, TakenBatch
from user_rl.wire import user_rl_pb2 as pb

OBS_SPACE = gym.spaces.Dict(
    {
        "image": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
        "state": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    }
)
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
SMALL = BufferConfig(segment_mb=0.001)  # 256-row segments: a few hundred records span several


class Robot:
    """A deterministic robot. Episodes of `length` steps end alternately terminated with success,
    truncated with failure, truncated unlabelled; every `human_every`-th step is a human's.
    Keeps what the index should say about each episode."""

    def __init__(self, length: int, human_every: int = 0) -> None:
        self.length, self.human_every = length, human_every
        self.episode = self.step = self.t = 0
        self.version = 0
        self.episodes: dict[int, dict] = {}

    def obs(self) -> dict[str, np.ndarray]:
        return {
            "image": np.full((4, 4, 3), self.t % 256, np.uint8),
            "state": np.full(3, (self.t % 100) / 100, np.float32),
        }

    def batch(self, rows: int) -> dict[str, np.ndarray]:
        self.version += 1
        builder = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=rows)
        for _ in range(rows):
            ep = self.episodes.setdefault(
                self.episode, {"length": 0, "interventions": 0, "status": "open", "success": None}
            )
            ends = self.step == self.length - 1
            kind = self.episode % 3
            terminated, truncated = ends and kind == 0, ends and kind != 0
            label = pb.LABEL_NONE
            if ends and kind < 2:
                label = pb.LABEL_SUCCESS if kind == 0 else pb.LABEL_FAILURE
            human = self.human_every and self.t % self.human_every == 0
            obs = self.obs()
            self.t += 1
            builder.add(
                obs,
                np.array([0.5, -0.5], np.float32),
                1.0,
                terminated,
                truncated,
                episode=self.episode,
                step=self.step,
                policy_version=self.version,
                actor=pb.ACTOR_HUMAN if human else pb.ACTOR_POLICY,
                label=label,
                sensor_time=0.0,
                final_obs=self.obs() if ends else None,
            )
            ep["length"] += 1
            ep["interventions"] += int(bool(human))
            self.step += 1
            if ends:
                ep["status"] = "terminated" if terminated else "truncated"
                ep["success"] = None if label == pb.LABEL_NONE else int(label == pb.LABEL_SUCCESS)
                self.episode, self.step = self.episode + 1, 0
        return builder.take()[1]

    def restart(self) -> None:
        """The edge restarted: its open episode ends truncated (the store does that on a new epoch)."""
        for ep in self.episodes.values():
            if ep["status"] == "open":
                ep["status"], ep["cut_short"] = "truncated", True


def write(store: PersistentReplay, plan: list[tuple[str, int, str, Robot, int]], commit_every: int = 3) -> dict:
    """Add `plan` = [(robot, epoch, task, generator, batches)] interleaved; what was written, per robot."""
    written: dict[str, dict] = {}
    seqs: dict[tuple[str, int], int] = {}
    pending = [list(p) for p in plan]
    i = 0
    while any(p[4] for p in pending):
        for p in pending:
            robot, epoch, task, gen, left = p
            if not left or any(q[0] == robot and q[1] < epoch and q[4] for q in pending):
                continue  # a robot's newer epoch starts when its older one is done
            if (robot, epoch) not in seqs:  # the robot's older streams end their open episodes
                for q in pending:
                    if q[0] == robot and q[1] < epoch:
                        q[3].restart()
                store.end_finished_streams(robot, epoch)
            stream = store.open_stream(robot, epoch, task)
            seqs[(robot, epoch)] = seqs.get((robot, epoch), 0) + 1
            cols = gen.batch(10)
            assert store.add(stream, seqs[(robot, epoch)], cols)
            w = written.setdefault(robot, {"batches": 0, "records": 0, "epochs": set(), "versions": []})
            w["batches"] += 1
            w["records"] += len(cols["reward"])
            w["epochs"].add(epoch)
            w["versions"] += cols["policy_version"].tolist()
            p[4] -= 1
            i += 1
            if i % commit_every == 0:
                store.commit()
    store.commit()
    return written


def standard_buffer(directory: Path, settings: BufferConfig = SMALL) -> tuple[dict, dict[str, list[Robot]], int]:
    store = PersistentReplay(directory, OBS_SPACE, ACTION_SPACE, settings)
    a, b1, b2 = Robot(7, human_every=5), Robot(6), Robot(6)
    written = write(
        store, [("robot-a", 1, "reach", a, 30), ("robot-b", 1, "push", b1, 8), ("robot-b", 2, "push", b2, 8)]
    )
    store.close()
    return written, {"robot-a": [a], "robot-b": [b1, b2]}, store.transitions


def episodes_of(gens: list[Robot]) -> list[dict]:
    return [ep for g in gens for ep in g.episodes.values()]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "user_rl.cli", "buffer", "inspect", *args], capture_output=True, text=True, timeout=120
    )


def sealed(directory: Path) -> list[Path]:
    return sorted(directory.glob("seg-*.seg"))


def test_report_counts_match_what_was_written(tmp_path: Path) -> None:
    written, gens, transitions = standard_buffer(tmp_path / "buf")
    report = inspect_buffer(tmp_path / "buf")
    assert report["ok"] and report["verified"] and not report["problems"] and not report["corrupt"]
    files = sealed(tmp_path / "buf")
    assert len(files) >= 3
    assert report["segments"]["ok"] == report["segments"]["indexed"] == len(files)
    assert report["segments"]["corrupt"] == report["segments"]["evicted"] == 0
    assert report["segments"]["unindexed"] == [] and report["segments"]["open"] == []
    assert [c["status"] for c in report["segments"]["checks"]] == ["ok"] * len(files)
    assert report["segment_rows"] == 256 and "image" in report["spaces"]["observation"]

    total_records = sum(w["records"] for w in written.values())
    assert report["records"] == total_records == 460
    assert report["batches"] == sum(w["batches"] for w in written.values()) == 46
    assert report["transitions"] == transitions > 0
    assert report["records"] <= report["rows"] <= 256 * len(files)
    assert report["bytes"]["segments"] == sum(p.stat().st_size for p in files)
    assert report["records_evicted"] == report["records_corrupt"] == 0

    assert sorted(report["robots"]) == ["robot-a", "robot-b"]
    for robot, r in report["robots"].items():
        eps = episodes_of(gens[robot])
        labelled = [e["success"] for e in eps if e["success"] is not None]
        assert r["batches"] == written[robot]["batches"]
        assert r["records"] == written[robot]["records"]
        assert r["epochs"] == sorted(written[robot]["epochs"]) and r["streams"] == len(r["epochs"])
        assert r["episodes"] == len(eps)
        assert r["labelled"] == len(labelled) and r["success_rate"] == pytest.approx(np.mean(labelled))
        assert r["interventions"] == sum(e["interventions"] for e in eps)
        assert r["policy_versions"] == [min(written[robot]["versions"]), max(written[robot]["versions"])]
    assert report["robots"]["robot-a"]["interventions"] == 60  # every 5th of 300 steps
    assert report["robots"]["robot-b"]["tasks"] == ["push"]

    everything = [e for g in gens.values() for e in episodes_of(g)]
    assert report["episodes"]["total"] == len(everything)
    for status in ("terminated", "truncated", "open"):
        assert report["episodes"][status] == sum(e["status"] == status for e in everything), status
    assert report["episodes"]["cut_short"] == sum(e.get("cut_short", False) for e in everything) == 1
    assert report["episodes"]["open"] == 2
    labelled = [e["success"] for e in everything if e["success"] is not None]
    assert report["success_rate"] == pytest.approx(np.mean(labelled))
    assert report["interventions"] == 60
    assert report["tasks"]["reach"]["robots"] == ["robot-a"] and report["tasks"]["push"]["robots"] == ["robot-b"]
    assert report["tasks"]["push"]["episodes"] == report["robots"]["robot-b"]["episodes"]

    text = format_report(report)
    head, *rest = text.splitlines()
    assert "OK" in head and "2 robots" in head and f"{report['transitions']:,} transitions" in head
    assert any(line.startswith("robot-a") and " 300 " in line for line in rest)
    assert "problems" not in text


def test_cli_json_is_parseable_and_exits_0(tmp_path: Path) -> None:
    written, _, _ = standard_buffer(tmp_path / "buf")
    result = cli(str(tmp_path / "buf"), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["records"] == 460
    assert {r: v["batches"] for r, v in report["robots"].items()} == {r: w["batches"] for r, w in written.items()}
    text = cli(str(tmp_path / "buf"), "--no-verify")
    assert text.returncode == 0 and text.stdout.startswith(f"buffer {tmp_path / 'buf'}: OK")
    assert "headers only" in text.stdout


def test_a_flipped_byte_is_found_named_and_exits_1(tmp_path: Path) -> None:
    directory = tmp_path / "buf"
    standard_buffer(directory)
    files = sealed(directory)
    victim = files[1]
    first = read_layout(victim)["columns"][0]
    with open(victim, "r+b") as f:  # one byte of the first column's region, inside the stored rows
        f.seek(first["offset"] + 7)
        byte = f.read(1)
        f.seek(first["offset"] + 7)
        f.write(bytes([byte[0] ^ 0xFF]))

    result = cli(str(directory))
    assert result.returncode == 1, result.stdout + result.stderr
    bad = [line.strip() for line in result.stdout.splitlines() if "CORRUPT " in line and "buffer " not in line]
    assert len(bad) == 1 and bad[0].startswith(f"CORRUPT {victim}: column_crc (column {first['name']!r}: crc32")
    assert result.stdout.splitlines()[0].startswith(f"buffer {directory}: CORRUPT")

    report = json.loads(cli(str(directory), "--json").stdout)
    assert not report["ok"]
    assert [(c["file"], c["reason"]) for c in report["corrupt"]] == [(victim.name, "column_crc")]
    assert report["segments"]["corrupt"] == 1 and report["segments"]["ok"] == len(files) - 1
    checks = {c["file"]: c["status"] for c in report["segments"]["checks"]}
    assert checks == {p.name: ("corrupt" if p == victim else "ok") for p in files}
    # Without checksums the flipped byte goes unseen (the header and size are fine).
    assert cli(str(directory), "--no-verify").returncode == 0


@pytest.mark.parametrize("keep, reason", [(1000, "short"), (-ALIGNMENT, "truncated")])
def test_a_truncated_segment_is_reported(tmp_path: Path, keep: int, reason: str) -> None:
    directory = tmp_path / "buf"
    standard_buffer(directory)
    files = sealed(directory)
    victim = files[0]
    os.truncate(victim, keep if keep > 0 else victim.stat().st_size + keep)
    for verify in (True, False):  # a cut file is caught even without checksums
        report = inspect_buffer(directory, verify=verify)
        assert not report["ok"]
        assert [(c["path"], c["reason"]) for c in report["corrupt"]] == [(str(victim), reason)]
        assert report["segments"]["ok"] == len(files) - 1
    result = cli(str(directory))
    assert result.returncode == 1 and f"CORRUPT {victim}: {reason}" in result.stdout


def test_missing_buffer_exits_2_and_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-buffer"
    result = cli(str(missing))
    assert result.returncode == 2
    assert result.stdout == "" and str(missing) in result.stderr and result.stderr.startswith("user-rl: ")
    assert len(result.stderr.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    result = cli(str(tmp_path / "empty"), "--json")
    assert result.returncode == 2 and str(tmp_path / "empty" / "index.sqlite") in result.stderr
    assert not missing.exists() and os.listdir(tmp_path / "empty") == []
    with pytest.raises(FileNotFoundError, match="no-such-buffer"):
        inspect_buffer(missing)


def test_inspect_changes_nothing_in_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "buf"
    standard_buffer(directory)
    before = snapshot(directory)
    assert sorted(before) == ["index.sqlite", *[p.name for p in sealed(directory)]]
    inspect_buffer(directory)
    inspect_buffer(directory, verify=False)
    assert cli(str(directory), "--json").returncode == 0
    assert snapshot(directory) == before  # no -wal/-shm left behind, no byte changed


def test_inspect_while_a_learner_writes(tmp_path: Path) -> None:
    """A live store: sealed segments are indexed, the open one is reported with its committed
    batches; more data and a close later, the counts follow, and inspecting left nothing behind."""
    directory = tmp_path / "buf"
    store = PersistentReplay(directory, OBS_SPACE, ACTION_SPACE, SMALL)
    a = Robot(7)
    write(store, [("robot-a", 1, "reach", a, 30)])
    live = inspect_buffer(directory)
    assert live["ok"], live["problems"]
    (open_segment,) = live["segments"]["open"]
    assert open_segment["segment"] == store.open_id
    assert sorted(open_segment["files"]) == [f"open-{store.open_id:08d}.log", f"open-{store.open_id:08d}.seg"]
    indexed_batches = live["robots"]["robot-a"]["batches"]
    assert indexed_batches + open_segment["committed_batches"] == 30
    assert live["records"] + open_segment["committed_records"] == 300
    assert live["segments"]["ok"] == len(sealed(directory)) >= 1
    assert any(n.startswith("OPEN ") for n in live["notes"])

    write(store, [("robot-b", 1, "push", Robot(6), 30)])
    later = inspect_buffer(directory)
    assert later["ok"] and later["segments"]["ok"] > live["segments"]["ok"]
    assert sorted(later["robots"]) == ["robot-a", "robot-b"]
    store.close()
    done = inspect_buffer(directory)
    assert done["ok"] and done["segments"]["open"] == [] and done["records"] == 600 and done["batches"] == 60
    assert done["transitions"] == store.transitions
    assert sorted(os.listdir(directory)) == ["index.sqlite", *[p.name for p in sealed(directory)]]


def test_crash_leftovers_are_reported_and_still_recover(tmp_path: Path) -> None:
    """A crash image (the directory copied while a learner runs): the open segment and its log
    are reported; inspecting keeps the data and commit log intact, so recovery still finds every
    committed batch."""
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    store = PersistentReplay(live, OBS_SPACE, ACTION_SPACE, SMALL)
    write(store, [("robot-a", 1, "reach", Robot(7), 31)])
    keys = store.batch_keys()
    shutil.copytree(live, crashed)
    store.close()

    before = {n: b for n, b in snapshot(crashed).items() if not n.endswith("-shm")}  # sqlite's shared memory
    report = inspect_buffer(crashed)
    assert report["ok"]
    (leftover,) = report["segments"]["open"]
    assert leftover["committed_batches"] >= 1
    assert report["robots"]["robot-a"]["batches"] + leftover["committed_batches"] == 31
    assert {n: b for n, b in snapshot(crashed).items() if not n.endswith("-shm")} == before

    recovered = PersistentReplay(crashed, OBS_SPACE, ACTION_SPACE, SMALL)
    assert recovered.batch_keys() == keys and len(keys) == 31
    recovered.close()
    after = inspect_buffer(crashed)
    assert after["ok"] and after["segments"]["open"] == [] and after["batches"] == 31 and after["records"] == 310


def test_evicted_and_unindexed_segments(tmp_path: Path) -> None:
    """Evicted segments are counted (their files are gone on purpose, not corrupt); a sealed file
    the index does not list is verified and noted, and does not fail the inspection."""
    directory = tmp_path / "buf"
    settings = BufferConfig(segment_mb=0.001, max_disk_gb=150_000 / 2**30)  # room for about one segment
    store = PersistentReplay(directory, OBS_SPACE, ACTION_SPACE, settings)
    write(store, [("robot-b", 1, "push", Robot(6), 80)])
    store.close()
    report = inspect_buffer(directory)
    assert report["ok"] and report["segments"]["evicted"] >= 1
    assert report["segments"]["ok"] == len(sealed(directory))
    assert report["records"] + report["records_evicted"] == 800
    assert report["robots"]["robot-b"]["records"] == 800  # the index remembers what was stored
    assert "evicted" in format_report(report)

    stray = directory / "seg-00000999.seg"
    shutil.copyfile(sealed(directory)[-1], stray)
    report = inspect_buffer(directory)
    assert report["ok"] and report["segments"]["unindexed"] == [stray.name]
    assert any(n.startswith(f"UNINDEXED {stray}") and n.endswith("reads back ok") for n in report["notes"])
    with open(stray, "r+b") as f:
        f.truncate(5000)
    report = inspect_buffer(directory)
    assert not report["ok"] and [(c["file"], c["reason"], c["indexed"]) for c in report["corrupt"]] == [
        (stray.name, "short", False)
    ]


def who_batch(robot: int, episodes: int) -> TakenBatch:
    """Episodes of 10 steps: warm-up (ACTOR_WARMUP, then a policy row without a version, as buffers
    before ACTOR_WARMUP wrote it), the policy, a person (holding nothing on 2 steps), the scripted
    intervener; each labelled at its end by a person, the env or a classifier in turn. By name: alice
    drives 2 steps on each robot, then bob holds nothing on arm-0 and someone unnamed on arm-1 (an
    edge from before names); carol gives arm-0's person labels, nobody named arm-1's."""
    actors = [pb.ACTOR_WARMUP, pb.ACTOR_POLICY, pb.ACTOR_POLICY, pb.ACTOR_POLICY] + [pb.ACTOR_HUMAN] * 4
    actors += [pb.ACTOR_SCRIPTED] * 2
    label_by = [pb.LABEL_BY_PERSON, pb.LABEL_BY_ENV, pb.LABEL_BY_CLASSIFIER]
    builder = BatchBuilder(OBS_SPACE, ACTION_SPACE, capacity=10 * episodes)
    for episode in range(episodes):
        for step, actor in enumerate(actors):
            ends = step == 9
            obs = {"image": np.zeros((4, 4, 3), np.uint8), "state": np.zeros(3, np.float32)}
            builder.add(
                obs,
                np.zeros(2, np.float32),
                0.0,
                ends,
                False,
                episode=episode,
                step=step,
                policy_version=-1 if step < 2 else 4,
                actor=actor,
                label=(pb.LABEL_SUCCESS if episode % 2 == 0 else pb.LABEL_FAILURE) if ends else pb.LABEL_NONE,
                label_by=label_by[(episode + robot) % 3] if ends else pb.LABEL_BY_ENV,
                sensor_time=0.0,
                final_obs=obs if ends else None,
                idle=actor == pb.ACTOR_HUMAN and step >= 6,
                person=("alice" if step < 6 else "bob" if robot == 0 else "") if actor == pb.ACTOR_HUMAN else "",
                label_person="carol" if robot == 0 and ends and (episode + robot) % 3 == 0 else "",
            )
    return builder.take_batch()


def test_who_acted_and_who_labelled_by_kind_and_robot(tmp_path: Path) -> None:
    """Rows by who acted (policy, warm-up, person and how many of theirs held nothing, scripted) and
    labels by who gave them, for the buffer and per robot, and both by person name (those that name
    nobody apart)."""
    store = PersistentReplay(tmp_path / "buf", OBS_SPACE, ACTION_SPACE, SMALL)
    for robot in range(2):
        stream = store.open_stream(f"arm-{robot}", 1, "reach")
        taken = who_batch(robot, 6)
        assert store.add(stream, 1, taken.columns, taken.people)
    store.close()
    result = cli(str(tmp_path / "buf"), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    who = report["who"]
    assert who["records"] == 120 and who["acted"] == {"policy": 24, "warmup": 24, "person": 48, "scripted": 24}
    assert who["person_idle"] == 24
    # 12 labels: each robot's episodes alternate success / failure, and person / env / classifier in turn
    assert who["labelled"] == {
        "person": {"success": 2, "failure": 2},
        "env": {"success": 2, "failure": 2},
        "classifier": {"success": 2, "failure": 2},
    }
    none = {"success": 0, "failure": 0}
    assert who["people"] == {
        "alice": {"acted": 24, "idle": 0, "labelled": none},
        "bob": {"acted": 12, "idle": 12, "labelled": none},
        "carol": {"acted": 0, "idle": 0, "labelled": {"success": 1, "failure": 1}},
    }
    assert who["unnamed"] == {"acted": 12, "idle": 12, "labelled": {"success": 1, "failure": 1}}
    arm0 = report["robots"]["arm-0"]["who"]
    assert arm0["records"] == 60 and arm0["acted"]["person"] == 24 and arm0["person_idle"] == 12
    assert arm0["labelled"]["person"] == {"success": 1, "failure": 1}  # episodes 0 (success) and 3 (failure)
    assert arm0["people"] == {
        "alice": {"acted": 12, "idle": 0, "labelled": none},
        "bob": {"acted": 12, "idle": 12, "labelled": none},
        "carol": {"acted": 0, "idle": 0, "labelled": {"success": 1, "failure": 1}},
    }
    arm1 = report["robots"]["arm-1"]["who"]
    assert arm1["people"] == {"alice": {"acted": 12, "idle": 0, "labelled": none}}
    assert arm1["unnamed"] == who["unnamed"]
    text = cli(str(tmp_path / "buf")).stdout
    assert "acted: 120 step records: policy 24, warm-up 24, person 48 (24 holding nothing), scripted 24" in text
    assert "labelled: person 2 success / 2 failure, env 2 success / 2 failure, classifier 2 success / 2 failure" in text
    assert "people by name: 3 people named; 12 person rows and 2 person labels name nobody" in text
    table = text[text.index("robot  records") :].splitlines()
    assert table[1].split() == ["arm-0", "60", "12", "12", "24", "12", "12", "1", "success", "/", "1", "failure"]
    people = text[text.index("person     acted") :].splitlines()
    assert [row.split() for row in people[1:5]] == [
        ["alice", "24", "0", "0", "success", "/", "0", "failure"],
        ["bob", "12", "12", "0", "success", "/", "0", "failure"],
        ["carol", "0", "0", "1", "success", "/", "1", "failure"],
        ["(no", "name)", "12", "12", "1", "success", "/", "1", "failure"],
    ]
    by_robot = text[text.index("robot  person") :].split("\n\n")[0].splitlines()
    assert [row.split()[:3] for row in by_robot[1:]] == [
        ["arm-0", "alice", "12"],
        ["arm-0", "bob", "12"],
        ["arm-0", "carol", "0"],
        ["arm-1", "alice", "12"],
        ["arm-1", "(no", "name)"],
    ]
