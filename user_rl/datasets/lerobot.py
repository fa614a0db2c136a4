"""A buffer as a LeRobotDataset (v3) and back: `user-rl buffer export --format lerobot` / `buffer import`.

An export is laid out as LeRobot's policies read it, so `lerobot-train` trains ACT or diffusion on it
as it is: each camera (HxWxC uint8) as `observation.images.<key>` (PNG inside the parquet, lossless),
the other observations concatenated as `observation.state` (in the order user-rl's LeRobot policy
runner feeds them, `policies/lerobot_policy.py`), and as `observation.environment_state` too where
there is no camera (ACT needs an image or an environment state); then `action`, `next.reward`,
`next.done`, `complementary_info.is_intervention` (HIL-SERL's name) and the per-frame `task`.

What ours carry beyond that rides in `user_rl.*` columns, which LeRobot's policies never see: each
non-camera observation exactly as stored (`user_rl.obs.<key>`), terminated and truncated apart, who
acted, the label and who gave it, the policy's own proposal when someone else acted, its version,
the robot's timestamp, and each episode's final observation (`user_rl.final.<key>`, flattened, on
its last frame, zeros elsewhere; never an image feature, which LeRobot would take for a camera). The
buffer's exact spaces, and which (robot, epoch, episode) each dataset episode is, are kept in
`meta/user_rl.json`, so an export imports back unchanged: episode numbers restart at 0 in each epoch
(each life of an edge), so without the epoch two robots' "episode 0"s would merge. Exports written
before this layout (format 1: `observation.<key>` per key, finals as `user_rl.final.observation.*`)
import as before. A dataset recorded by LeRobot itself imports with spaces read from its features
and stats.

LeRobot is imported lazily: the rest of user-rl works without it (it has an environment of its own:
`extras.LEROBOT_ENV_COMMAND`).
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from user_rl.cloud.buffer.episodes import (
    Episode,
    EpisodeFilter,
    buffer_spaces,
    count_episodes,
    read_episodes,
    recorded_rates,
)
from user_rl.extras import LEROBOT_MISSING
from user_rl.policies.lerobot_policy import lerobot_keys
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.spaces import spaces_from_text, spaces_to_text
from user_rl.wire.transitions import OBS, intervened

if TYPE_CHECKING:
    from user_rl.cloud.buffer.rows import StreamState
    from user_rl.cloud.buffer.store import PersistentReplay

OURS = "user_rl."
FINAL = OURS + "final."
OBS_COPY = OURS + "obs."  # a non-camera observation exactly as stored
SIDECAR = "meta/user_rl.json"  # the buffer's spaces, so an export imports back with the same bounds
FORMAT = 2  # the sidecar's "format": 2 since LeRobot trains on an export as it is; 1 (absent) before
IMAGES, STATE, ENV_STATE = "observation.images.", "observation.state", "observation.environment_state"
# our per-step scalar columns: (dtype in the dataset, dtype in the buffer)
SCALARS = {
    "terminated": ("bool", np.bool_),
    "truncated": ("bool", np.bool_),
    "actor": ("int64", np.uint8),
    "label": ("int64", np.uint8),
    "label_by": ("int64", np.uint8),
    "policy_version": ("int64", np.int64),
    "step": ("int64", np.int64),
}
# The robot's timestamp in integer nanoseconds: LeRobot's loader hands float64 columns back as float32,
# which keeps ~2 minutes of precision on a Unix time.
SENSOR_TIME_NS = OURS + "sensor_time_ns"
Progress = Callable[[int, int], None]


def require_lerobot():
    """LeRobot's dataset class, or an error that says how to get it."""
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError as exc:
        raise RuntimeError(f"the LeRobot format needs LeRobot: {LEROBOT_MISSING} (import failed: {exc})") from None
    return LeRobotDataset


def is_camera(space: gym.spaces.Box) -> bool:
    return space.dtype == np.uint8 and len(space.shape) == 3 and space.shape[-1] in (1, 3, 4)


def feature_name(key: str, space: gym.spaces.Box) -> str:
    """A key's column in a format-1 export (and in a dataset LeRobot recorded)."""
    return f"{IMAGES}{key}" if is_camera(space) else f"observation.{key}"


def dataset_features(obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> dict[str, dict]:
    """The LeRobot features of a buffer with these spaces."""
    cameras, state_keys = lerobot_keys(obs_space)
    features: dict[str, dict] = {}
    for key in cameras:
        features[IMAGES + key] = {
            "dtype": "image",
            "shape": tuple(obs_space[key].shape),
            "names": ["height", "width", "channels"],
        }
    if state_keys:
        size = sum(int(np.prod(obs_space[key].shape)) for key in state_keys)
        features[STATE] = {"dtype": "float32", "shape": (size,), "names": None}
        if not cameras:
            features[ENV_STATE] = features[STATE]
    for key, space in sorted(obs_space.spaces.items()):
        if key not in cameras:
            features[OBS_COPY + key] = {"dtype": str(space.dtype), "shape": tuple(space.shape), "names": None}
        features[FINAL + key] = {"dtype": str(space.dtype), "shape": (int(np.prod(space.shape)),), "names": None}
    action = {"dtype": "float32", "shape": tuple(action_space.shape), "names": None}
    features.update(
        {
            "action": action,
            "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
            "next.done": {"dtype": "bool", "shape": (1,), "names": None},
            "complementary_info.is_intervention": {"dtype": "bool", "shape": (1,), "names": None},
            OURS + "policy_action": action,
            OURS + "has_final": {"dtype": "bool", "shape": (1,), "names": None},
            **{OURS + name: {"dtype": dtype, "shape": (1,), "names": None} for name, (dtype, _) in SCALARS.items()},
            SENSOR_TIME_NS: {"dtype": "int64", "shape": (1,), "names": None},
        }
    )
    return features


def export_fps(buffer_dir: str | Path, which: EpisodeFilter | None) -> int:
    """The dataset's frame rate: the exported robots' control rate, as the buffer recorded it. A
    robot without one, or robots at different rates, need `--fps` (a dataset has one rate)."""
    rates = recorded_rates(buffer_dir, which)
    unknown = [robot for robot, hz in rates.items() if hz <= 0]
    if unknown:
        raise ValueError(
            f"{buffer_dir}: no control rate recorded for {', '.join(unknown)} (a robot without a clock, or a "
            "buffer written before user-rl kept it): give the dataset's frame rate with --fps"
        )
    known = sorted(set(rates.values()))
    if len(known) > 1:
        said = ", ".join(f"{robot} {hz:g} Hz" for robot, hz in rates.items())
        raise ValueError(f"the robots run at different rates ({said}): a dataset has one; export them apart (--robot)")
    if known[0] != round(known[0]):
        raise ValueError(f"the robots run at {known[0]:g} Hz; a LeRobot dataset's fps is a whole number: give --fps")
    return round(known[0])


def export_lerobot(
    buffer_dir: str | Path,
    out: str | Path,
    which: EpisodeFilter | None = None,
    repo_id: str = "local/user-rl",
    fps: int | None = None,
    robot_type: str | None = None,
    progress: Progress | None = None,
) -> dict:
    """Write the buffer's episodes that `which` admits as a LeRobotDataset at `out` (which must not exist)."""
    LeRobotDataset = require_lerobot()
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; LeRobot writes a new dataset directory")
    obs_space, action_space = buffer_spaces(buffer_dir)
    total = count_episodes(buffer_dir, which)
    if total == 0:
        raise ValueError(f"{buffer_dir}: no episode matches {which or EpisodeFilter()}")
    fps = fps or export_fps(buffer_dir, which)
    episodes = read_episodes(buffer_dir, which)
    first = next(episodes, None)  # before LeRobot makes a directory
    if first is None:
        raise ValueError(f"{buffer_dir}: the matching episodes' steps are no longer stored (evicted)")
    dataset = LeRobotDataset.create(
        repo_id, fps, dataset_features(obs_space, action_space), root=out, robot_type=robot_type, use_videos=False
    )
    origins, frames = [], 0  # which (robot, epoch, episode) each dataset episode is
    try:
        for episode in itertools.chain([first], episodes):
            for frame in _frames(episode, obs_space):
                dataset.add_frame(frame)
            dataset.save_episode()
            origins.append(
                {
                    "robot": episode.robot,
                    "epoch": episode.epoch,
                    "episode": episode.number,
                    "frames": len(episode),
                    "end_reason": episode.end_reason,
                }
            )
            frames += len(episode)
            if progress:
                progress(len(origins), total)
    finally:
        dataset.finalize()  # LeRobot cannot open a v3 dataset that was not finalized
    (out / SIDECAR).write_text(
        json.dumps(
            {
                "format": FORMAT,
                "spaces": spaces_to_text(obs_space, action_space)["hello_hex"],
                "source_buffer": str(Path(buffer_dir).resolve()),
                "episodes": origins,
            }
        )
    )
    return {"episodes": len(origins), "frames": frames, "fps": fps, "root": str(out)}


def _frames(episode: Episode, obs_space: gym.spaces.Dict) -> Iterable[dict]:
    s, last = episode.steps, len(episode) - 1
    acted = intervened(s["actor"])
    cameras, state_keys = lerobot_keys(obs_space)
    for i in range(len(episode)):
        frame = {
            "task": episode.task or "unnamed task",
            "action": s["action"][i].astype(np.float32),
            "next.reward": np.array([s["reward"][i]], np.float32),
            "next.done": np.array([bool(s["terminated"][i] or s["truncated"][i])]),
            "complementary_info.is_intervention": np.array([bool(acted[i])]),
            OURS + "policy_action": s["policy_action"][i].astype(np.float32),
            OURS + "has_final": np.array([i == last and episode.final_obs is not None]),
        }
        for name, (dtype, _) in SCALARS.items():
            frame[OURS + name] = np.array([s[name][i]], dtype)
        frame[SENSOR_TIME_NS] = np.array([round(float(s["sensor_time"][i]) * 1e9)], np.int64)
        if state_keys:
            frame[STATE] = np.concatenate([np.ravel(s[OBS + key][i]) for key in state_keys]).astype(np.float32)
            if not cameras:
                frame[ENV_STATE] = frame[STATE]
        for key, space in obs_space.spaces.items():
            frame[IMAGES + key if key in cameras else OBS_COPY + key] = s[OBS + key][i]
            final = episode.final_obs[key] if i == last and episode.final_obs is not None else None
            frame[FINAL + key] = np.ravel(final if final is not None else np.zeros(space.shape, space.dtype))
        yield frame


# -- import ---------------------------------------------------------------------------------------


def import_lerobot(
    root: str | Path,
    buffer_dir: str | Path,
    repo_id: str = "local/user-rl",
    progress: Progress | None = None,
    gamma: float = 0.99,
) -> dict:
    """Write a local LeRobotDataset's episodes into a new buffer directory, ready for `buffer.attach`
    (e.g. `source: demo` for RLPD or behaviour cloning). No hub: `root` must hold the whole dataset."""
    from user_rl.cloud.buffer.store import PersistentReplay
    from user_rl.config import BufferConfig
    from user_rl.edge.batching import BatchBuilder

    LeRobotDataset = require_lerobot()
    root, buffer_dir = Path(root), Path(buffer_dir)
    if not (root / "meta" / "info.json").is_file():
        raise FileNotFoundError(f"{root}: not a local LeRobotDataset (no meta/info.json)")
    if (buffer_dir / "index.sqlite").exists():
        raise FileExistsError(f"{buffer_dir} holds a buffer already; import into a new directory")
    dataset = LeRobotDataset(repo_id, root=root)
    obs_space, action_space = _spaces(root, dataset)
    origins = _origins(root, dataset.meta.total_episodes)
    store = PersistentReplay(buffer_dir, obs_space, action_space, BufferConfig(), gamma)
    ours = OURS + "actor" in dataset.features
    columns = _ObsColumns(obs_space, _format(root) if ours else 1)
    notes = []
    if "next.done" not in dataset.features:
        notes.append(
            "the dataset has no next.done: each episode's end is imported as truncated (a time limit or the "
            "recording stopped, so learning bootstraps past it), not as the task's end"
        )
    streams = _Streams(store)
    episodes = dataset.meta.total_episodes
    try:
        for number, origin in enumerate(origins):
            start, stop = _episode_bounds(dataset, number)
            if "frames" in origin and origin["frames"] != stop - start:
                raise ValueError(
                    f"{root}: episode {number} has {stop - start} frames but {SIDECAR} says "
                    f"{origin['frames']}: the dataset was changed after the export"
                )
            frames = [dataset[i] for i in range(start, stop)]  # LeRobot's own loader: tensors, images in [0, 1]
            stream, seq = streams.next_batch(number, origin, str(frames[0]["task"]))
            builder = BatchBuilder(obs_space, action_space, capacity=len(frames))
            for i, frame in enumerate(frames):
                builder.add(**_step(frame, i == len(frames) - 1, origin["episode"], columns, ours))
            cols = builder.take()[1]
            store.add(stream, seq, cols)
            if origin.get("end_reason") and not (cols["terminated"][-1] or cols["truncated"][-1]):
                store.end_open_episodes(stream, reason=origin["end_reason"])  # ended in the index only (a cut)
            store.commit()
            if progress:
                progress(number + 1, episodes)
    finally:
        store.close()
    return {"episodes": episodes, "frames": dataset.meta.total_frames, "buffer": str(buffer_dir), "notes": notes}


def _format(root: Path) -> int:
    """The layout of our export at `root` (`FORMAT`; 1 for one written before the sidecar said)."""
    return int(json.loads((root / SIDECAR).read_text()).get("format", 1)) if (root / SIDECAR).is_file() else 1


class _ObsColumns:
    """Where each observation key's value, and its episode's final value, are in a dataset's frames."""

    def __init__(self, obs_space: gym.spaces.Dict, layout: int) -> None:
        self.obs_space = obs_space
        if layout >= 2:
            cameras = lerobot_keys(obs_space)[0]
            self.now = {key: IMAGES + key if key in cameras else OBS_COPY + key for key in obs_space.spaces}
            self.final = {key: FINAL + key for key in obs_space.spaces}  # flattened, as stored
        else:  # format 1, and datasets LeRobot recorded (no finals)
            self.now = {key: feature_name(key, space) for key, space in obs_space.spaces.items()}
            self.final = {key: FINAL + name for key, name in self.now.items()}

    def observation(self, frame: dict) -> dict[str, np.ndarray]:
        return {key: _from_lerobot(frame[name], self.obs_space[key]) for key, name in self.now.items()}

    def final_observation(self, frame: dict) -> dict[str, np.ndarray]:
        return {key: _from_lerobot(frame[name], self.obs_space[key]) for key, name in self.final.items()}


def _origins(root: Path, total: int) -> list[dict]:
    """Which (robot, epoch, episode) each dataset episode is, from our export's sidecar; a dataset
    LeRobot recorded is one robot, `lerobot`, its episodes numbered as in the dataset."""
    sidecar = json.loads((root / SIDECAR).read_text()) if (root / SIDECAR).is_file() else {}
    origins = sidecar.get("episodes") or [{"robot": "lerobot", "episode": n} for n in range(total)]
    if len(origins) != total:
        raise ValueError(
            f"{root}: {SIDECAR} names {len(origins)} episodes but the dataset has {total}: "
            "the dataset was changed after the export"
        )
    return origins


class _Streams:
    """The buffer stream each imported episode goes to: one per (robot, epoch), as exported.

    Where the dataset does not say the epoch (recorded by LeRobot, or exported before epochs were
    kept), each (robot, task) gets an epoch of its own, and a new one whenever an episode number
    comes again: numbers restart at 0 after an edge restart, and two episodes never merge."""

    def __init__(self, store: PersistentReplay) -> None:
        self.store = store
        # (robot, epoch) -> its stream, its task, the seq of its last batch
        self.opened: dict[tuple[str, int], tuple[StreamState, str, int]] = {}
        self.guessed: dict[tuple[str, str], tuple[int, set[int]]] = {}  # (robot, task) -> epoch, its episodes
        self.named: set[tuple[str, int, int]] = set()  # (robot, epoch, episode) imported

    def next_batch(self, number: int, origin: dict, task: str) -> tuple[StreamState, int]:
        """The stream for dataset episode `number` and the seq its batch takes there."""
        robot, episode = str(origin["robot"]), int(origin["episode"])
        epoch = int(origin["epoch"]) if "epoch" in origin else self._guess_epoch(robot, task, episode)
        if (robot, epoch, episode) in self.named:
            raise ValueError(
                f"dataset episode {number} is robot {robot}'s epoch {epoch} episode {episode} again: "
                f"two episodes would merge into one; {SIDECAR} does not describe this dataset"
            )
        self.named.add((robot, epoch, episode))
        stream, stream_task, seq = self.opened.get((robot, epoch)) or (None, task, 0)
        if stream_task != task:
            raise ValueError(
                f"dataset episode {number} (robot {robot}, epoch {epoch}, episode {episode}) has task "
                f"{task!r}, but that epoch's earlier episodes have {stream_task!r}: an epoch has one "
                f"task; {SIDECAR} does not describe this dataset"
            )
        stream = stream or self.store.open_stream(robot, epoch, task)
        self.opened[robot, epoch] = (stream, task, seq + 1)
        return stream, seq + 1

    def _guess_epoch(self, robot: str, task: str, episode: int) -> int:
        epoch, seen = self.guessed.get((robot, task), (0, set()))
        if not epoch or episode in seen:
            epoch, seen = 1 + max((e for r, e in self.opened if r == robot), default=0), set()
        seen.add(episode)
        self.guessed[robot, task] = (epoch, seen)
        return epoch


def _episode_bounds(dataset, number: int) -> tuple[int, int]:
    episode = dataset.meta.episodes[number]
    return int(episode["dataset_from_index"]), int(episode["dataset_to_index"])


def _spaces(root: Path, dataset) -> tuple[gym.spaces.Dict, gym.spaces.Box]:
    """The spaces an export recorded, else ones read from LeRobot's features (action bounds from its stats)."""
    sidecar = root / SIDECAR
    if sidecar.is_file():
        return spaces_from_text({"hello_hex": json.loads(sidecar.read_text())["spaces"]})
    obs = {}
    for name, spec in dataset.features.items():
        if name.startswith("observation.images.") and spec["dtype"] == "image":
            obs[name.removeprefix("observation.images.")] = gym.spaces.Box(0, 255, tuple(spec["shape"]), np.uint8)
        elif name.startswith("observation.") and spec["dtype"] not in ("image", "video", "string"):
            obs[name.removeprefix("observation.")] = gym.spaces.Box(
                -np.inf, np.inf, tuple(spec["shape"]), np.dtype(spec["dtype"])
            )
    if not obs or "action" not in dataset.features:
        raise ValueError(
            f"{root}: a dataset needs observation.* features and an action to import "
            f"(it has {sorted(dataset.features)}); videos are not read yet"
        )
    stats = dataset.meta.stats.get("action", {})
    low = np.asarray(stats.get("min", -np.inf), np.float32).reshape(dataset.features["action"]["shape"])
    high = np.asarray(stats.get("max", np.inf), np.float32).reshape(dataset.features["action"]["shape"])
    return gym.spaces.Dict(obs), gym.spaces.Box(low, high, dtype=np.float32)


def _step(frame: dict, last: bool, episode: int, columns: _ObsColumns, ours: bool) -> dict:
    """One frame as `BatchBuilder.add`'s arguments."""

    def value(name: str) -> np.ndarray:
        return np.asarray(frame[name]).reshape(-1)

    action = value("action").astype(np.float32)
    done = bool(value("next.done")[0]) if "next.done" in frame else False  # no word of an end: truncated
    if ours:
        scalar = {name: value(OURS + name)[0].item() for name in SCALARS}
        terminated, truncated = bool(scalar["terminated"]), bool(scalar["truncated"])
        has_final = bool(value(OURS + "has_final")[0])
        final = columns.final_observation(frame) if has_final else None
        extra = {
            "actor": int(scalar["actor"]),
            "label": int(scalar["label"]),
            "label_by": int(scalar["label_by"]),
            "policy_version": int(scalar["policy_version"]),
            "sensor_time": int(value(SENSOR_TIME_NS)[0]) / 1e9,
            "step": int(scalar["step"]),
            "policy_action": value(OURS + "policy_action").astype(np.float32),
        }
    else:  # recorded by LeRobot: a person acted throughout unless the dataset says otherwise
        terminated, truncated = done and last, last and not done
        final = columns.observation(frame) if last else None  # the last frame stands in for the one after it
        acted = value("complementary_info.is_intervention")[0] if "complementary_info.is_intervention" in frame else 1
        extra = {
            "actor": pb.ACTOR_HUMAN if acted else pb.ACTOR_POLICY,
            "label": pb.LABEL_NONE,
            "label_by": 0,
            "policy_version": 0,
            "sensor_time": float(value("timestamp")[0]),
            "step": int(value("frame_index")[0]),
            "policy_action": action,
        }
    reward = float(value("next.reward")[0]) if "next.reward" in frame else 0.0
    return {
        "obs": columns.observation(frame),
        "action": action,
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
        "episode": episode,
        "final_obs": final if (terminated or truncated) else None,
        **extra,
    }


def _from_lerobot(value, space: gym.spaces.Box) -> np.ndarray:
    """LeRobot's loader gives image features as float CxHxW in [0, 1]: back to the HxWxC uint8 they
    were. Anything else (a vector, a flattened final observation) is the stored values, reshaped."""
    array = np.asarray(value)
    if space.dtype == np.uint8 and len(space.shape) == 3 == array.ndim and array.dtype != np.uint8:
        return np.clip(np.rint(array.transpose(1, 2, 0) * 255.0), 0, 255).astype(np.uint8)
    return array.astype(space.dtype).reshape(space.shape)


def print_progress(label: str) -> Progress:
    """A progress callback that prints `label: n/total episodes` at most every 2 s, and the last one."""
    shown = [0.0]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - shown[0] >= 2.0:
            shown[0] = now
            print(f"{label}: {done:,}/{total:,} episodes", file=sys.stderr, flush=True)

    return report
