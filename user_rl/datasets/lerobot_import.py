"""A local LeRobotDataset as a new buffer directory: `user-rl buffer import`.

Our own exports come back unchanged (their spaces and each episode's robot, epoch and number are in
`meta/user_rl.json`), but for a video export's frames, which come back within the codec's error. A
dataset recorded by LeRobot imports as a person's demonstrations, its spaces read from its features
and stats. Every observation feature, PNG and video cameras alike, becomes a buffer key, or the import
stops on an error that names it: nothing is dropped without a word. The buffer is built in a scratch
directory beside the target and renamed into place only when complete, so a failed or killed import
leaves no half-made buffer behind and the same command can simply run again.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from user_rl.datasets.lerobot import (
    FINAL,
    IMAGES,
    OBS_COPY,
    OURS,
    SCALARS,
    SENSOR_TIME_NS,
    SIDECAR,
    Progress,
    feature_name,
    require_lerobot,
)
from user_rl.policies.lerobot_policy import lerobot_keys
from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.spaces import spaces_from_text
from user_rl.wire.transitions import ACTOR_PERSON, IDLE, LABEL_PERSON

if TYPE_CHECKING:
    from user_rl.cloud.buffer.rows import StreamState
    from user_rl.cloud.buffer.store import PersistentReplay

VIDEO_BACKENDS = ("torchcodec", "pyav")
# The columns every LeRobot dataset has, and the ones the import reads besides observations.
BOOKKEEPING = {"timestamp", "frame_index", "episode_index", "index", "task_index"}
READ = {"action", "next.reward", "next.done", "complementary_info.is_intervention"}


def import_lerobot(
    root: str | Path,
    buffer_dir: str | Path,
    repo_id: str = "local/user-rl",
    progress: Progress | None = None,
    gamma: float = 0.99,
    video_backend: str | None = None,
) -> dict:
    """Write a local LeRobotDataset's episodes into a new buffer directory, ready for `buffer.attach`
    (e.g. `source: demo` for RLPD or behaviour cloning). No hub: `root` must hold the whole dataset.
    Videos are decoded with LeRobot's `video_backend` (its default: torchcodec, which needs FFmpeg's
    shared libraries; pyav brings its own)."""
    from user_rl.cloud.buffer.store import PersistentReplay
    from user_rl.config import BufferConfig

    LeRobotDataset = require_lerobot()
    root, buffer_dir = Path(root), Path(buffer_dir)
    if not (root / "meta" / "info.json").is_file():
        raise FileNotFoundError(f"{root}: not a local LeRobotDataset (no meta/info.json)")
    if buffer_dir.exists() and any(buffer_dir.iterdir()):
        raise FileExistsError(f"{buffer_dir} is not empty; import into a new directory")
    if video_backend is not None and video_backend not in VIDEO_BACKENDS:
        raise ValueError(f"unknown video backend {video_backend!r}: LeRobot decodes with {' or '.join(VIDEO_BACKENDS)}")
    dataset = LeRobotDataset(repo_id, root=root, video_backend=video_backend)
    obs_space, action_space, names = _spaces(root, dataset)
    origins = _origins(root, dataset.meta.total_episodes)
    people = _people(root)
    ours = OURS + "actor" in dataset.features
    columns = _ObsColumns(obs_space, _format(root) if ours else 1, names)
    notes = _notes(dataset.features, ours)
    _remove_killed_imports(buffer_dir)
    scratch = buffer_dir.with_name(f"{buffer_dir.name}.importing-{os.getpid()}")
    store = PersistentReplay(scratch, obs_space, action_space, BufferConfig(), gamma)
    try:
        try:
            _import_episodes(dataset, root, origins, store, columns, action_space, ours, people, progress)
        finally:
            store.close()
        if buffer_dir.exists():
            buffer_dir.rmdir()  # empty, checked above
        os.replace(scratch, buffer_dir)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return {"episodes": len(origins), "frames": dataset.meta.total_frames, "buffer": str(buffer_dir), "notes": notes}


def _remove_killed_imports(buffer_dir: Path) -> None:
    """Scratch directories that imports into `buffer_dir` left when they were killed (their process
    is gone), so that they do not pile up beside it."""
    for scratch in buffer_dir.parent.glob(f"{buffer_dir.name}.importing-*"):
        pid = scratch.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(scratch, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True


def _import_episodes(
    dataset,
    root: Path,
    origins: list[dict],
    store: PersistentReplay,
    columns: _ObsColumns,
    action_space: gym.spaces.Box,
    ours: bool,
    people: dict[int, str],
    progress: Progress | None,
) -> None:
    from user_rl.edge.batching import BatchBuilder

    streams = _Streams(store)
    for number, origin in enumerate(origins):
        start, stop = _episode_bounds(dataset, number)
        if "frames" in origin and origin["frames"] != stop - start:
            raise ValueError(
                f"{root}: episode {number} has {stop - start} frames but {SIDECAR} says "
                f"{origin['frames']}: the dataset was changed after the export"
            )
        frames = _episode_frames(dataset, root, number, start, stop)
        stream, seq = streams.next_batch(number, origin, str(frames[0]["task"]))
        builder = BatchBuilder(columns.obs_space, action_space, capacity=len(frames))
        for i, frame in enumerate(frames):
            builder.add(**_step(frame, i == len(frames) - 1, origin["episode"], columns, ours, people))
        taken = builder.take_batch()
        cols = taken.columns
        store.add(stream, seq, cols, taken.people)
        if origin.get("end_reason") and not (cols["terminated"][-1] or cols["truncated"][-1]):
            store.end_open_episodes(stream, reason=origin["end_reason"])  # ended in the index only (a cut)
        store.commit()
        if progress:
            progress(number + 1, len(origins))


def _episode_frames(dataset, root: Path, number: int, start: int, stop: int) -> list[dict]:
    """One episode's frames as LeRobot's loader gives them (tensors, images CxHxW in [0, 1]); each
    camera's video is decoded in one pass over the episode rather than one seek per frame."""
    from lerobot.datasets.video_utils import decode_video_frames

    rows = dataset.hf_dataset[start:stop]
    frames = [{name: values[i] for name, values in rows.items()} for i in range(stop - start)]
    tasks = dataset.meta.tasks
    for frame in frames:
        frame["task"] = tasks.iloc[int(frame["task_index"])].name
    episode = dataset.meta.episodes[number]
    for key in dataset.meta.video_keys:
        path = root / dataset.meta.get_video_file_path(number, key)
        offset = float(episode[f"videos/{key}/from_timestamp"])
        times = [offset + float(frame["timestamp"]) for frame in frames]
        try:
            decoded = decode_video_frames(path, times, dataset.tolerance_s, dataset.video_backend)
        except Exception as exc:
            missing = "Could not load" in str(exc)  # torchcodec found no FFmpeg libraries it can use
            raise RuntimeError(
                f"{root}: cannot decode {key} of episode {number} ({path}) with LeRobot's "
                f"{dataset.video_backend} video backend: {exc}{NO_FFMPEG if missing else ''}"
            ) from None
        decoded = decoded.reshape(len(frames), *decoded.shape[-3:])
        for frame, image in zip(frames, decoded):
            frame[key] = image
    return frames


NO_FFMPEG = (
    " (torchcodec needs FFmpeg's shared libraries: apt-get install ffmpeg; or import with --video-backend pyav, "
    "whose wheel brings its own)"
)


def _notes(features: dict, ours: bool) -> list[str]:
    """What a person should know about how the dataset was read: columns it has that a buffer does
    not keep, and episode ends without a word of why."""
    notes = []
    if "next.done" not in features:
        notes.append(
            "the dataset has no next.done: each episode's end is imported as truncated (a time limit or the "
            "recording stopped, so learning bootstraps past it), not as the task's end"
        )
    unread = sorted(
        name
        for name in features
        if not name.startswith("observation.") and name not in BOOKKEEPING | READ and not name.startswith(OURS)
    )
    if unread and not ours:
        notes.append(f"not imported (a buffer keeps observations, actions, rewards and ends): {', '.join(unread)}")
    return notes


def _format(root: Path) -> int:
    """The layout of our export at `root` (`FORMAT`; 1 for one written before the sidecar said)."""
    return int(json.loads((root / SIDECAR).read_text()).get("format", 1)) if (root / SIDECAR).is_file() else 1


class _ObsColumns:
    """Where each observation key's value, and its episode's final value, are in a dataset's frames."""

    def __init__(self, obs_space: gym.spaces.Dict, layout: int, names: dict[str, str] | None = None) -> None:
        self.obs_space = obs_space
        if layout >= 2:
            cameras = lerobot_keys(obs_space)[0]
            self.now = {key: IMAGES + key if key in cameras else OBS_COPY + key for key in obs_space.spaces}
            self.final = {key: FINAL + key for key in obs_space.spaces}  # flattened, as stored
        else:  # format 1, and datasets LeRobot recorded (no finals; `names` says each key's feature)
            self.now = names or {key: feature_name(key, space) for key, space in obs_space.spaces.items()}
            self.final = {key: FINAL + name for key, name in self.now.items()}

    def observation(self, frame: dict) -> dict[str, np.ndarray]:
        return {key: _from_lerobot(frame[name], self.obs_space[key]) for key, name in self.now.items()}

    def final_observation(self, frame: dict) -> dict[str, np.ndarray]:
        return {key: _from_lerobot(frame[name], self.obs_space[key]) for key, name in self.final.items()}


def _people(root: Path) -> dict[int, str]:
    """The names of the person ids in our export's frames (none in a dataset LeRobot recorded, or an
    export from before they were kept)."""
    sidecar = json.loads((root / SIDECAR).read_text()) if (root / SIDECAR).is_file() else {}
    return {int(i): str(name) for i, name in (sidecar.get("people") or {}).items()}


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


def _spaces(root: Path, dataset) -> tuple[gym.spaces.Dict, gym.spaces.Box, dict[str, str]]:
    """The spaces an export recorded, else ones read from LeRobot's features (action bounds from its
    stats), and for the latter which feature each buffer key comes from."""
    sidecar = root / SIDECAR
    if sidecar.is_file():
        obs_space, action_space = spaces_from_text({"hello_hex": json.loads(sidecar.read_text())["spaces"]})
        return obs_space, action_space, {}
    obs, names = {}, {}
    for name, spec in dataset.features.items():
        if not name.startswith("observation."):
            continue
        key = name.removeprefix("observation.images.").removeprefix("observation.")
        if key in obs:
            raise ValueError(f"{root}: features {names[key]} and {name} would both be the buffer's key {key!r}")
        obs[key], names[key] = _observation_space(root, name, spec), name
    if not obs or "action" not in dataset.features:
        raise ValueError(
            f"{root}: a dataset needs observation.* features and an action to import "
            f"(it has {sorted(dataset.features)})"
        )
    stats = dataset.meta.stats.get("action", {})
    low = np.asarray(stats.get("min", -np.inf), np.float32).reshape(dataset.features["action"]["shape"])
    high = np.asarray(stats.get("max", np.inf), np.float32).reshape(dataset.features["action"]["shape"])
    return gym.spaces.Dict(obs), gym.spaces.Box(low, high, dtype=np.float32), names


def _observation_space(root: Path, name: str, spec: dict) -> gym.spaces.Box:
    """The buffer space of one of a dataset's observation features, or an error that names it."""
    dtype, shape = spec["dtype"], tuple(spec["shape"])
    if dtype in ("image", "video"):
        axes = [str(axis) for axis in spec.get("names") or ()]
        if len(shape) != 3:
            raise ValueError(f"{root}: camera {name} has shape {shape}; a camera is height x width x channels")
        height, width, channels = (*shape[1:], shape[0]) if axes and axes[0].startswith("channel") else shape
        if channels not in (1, 3, 4):
            raise ValueError(f"{root}: camera {name} has {channels} channels (names {axes}); 1, 3 or 4 can be read")
        return gym.spaces.Box(0, 255, (height, width, channels), np.uint8)
    try:
        numeric = np.dtype(dtype)
    except TypeError:
        numeric = np.dtype(object)
    if numeric.kind not in "biuf":
        raise ValueError(
            f"{root}: observation feature {name} is {dtype}, which a buffer cannot hold (numbers and "
            "images only): drop it first with lerobot-edit-dataset --operation.type remove_feature"
        )
    return gym.spaces.Box(-np.inf, np.inf, shape, numeric)


def _step(frame: dict, last: bool, episode: int, columns: _ObsColumns, ours: bool, people: dict[int, str]) -> dict:
    """One frame as `BatchBuilder.add`'s arguments (`people`: the export's names of its person ids)."""

    def value(name: str) -> np.ndarray:
        return np.asarray(frame[name]).reshape(-1)

    action = value("action").astype(np.float32)
    done = bool(value("next.done")[0]) if "next.done" in frame else False  # no word of an end: truncated
    if ours:
        scalar = {name: value(OURS + name)[0].item() for name in SCALARS if OURS + name in frame}  # older: fewer
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
            "idle": bool(value(OURS + IDLE)[0]) if OURS + IDLE in frame else False,  # exports before it: none
            "person": people.get(int(scalar.get(ACTOR_PERSON, 0)), ""),  # exports before them: nobody named
            "label_person": people.get(int(scalar.get(LABEL_PERSON, 0)), ""),
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
