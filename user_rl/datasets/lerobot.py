"""A buffer as a LeRobotDataset (v3): the layout both ways, and `user-rl buffer export --format lerobot`.

An export is laid out as LeRobot's policies read it, so `lerobot-train` trains ACT or diffusion on it
as it is: each camera (HxWxC uint8) as `observation.images.<key>` (PNG frames inside the parquet,
lossless, by default; or, with `video=True`, an MP4 per camera encoded as `lerobot-record` encodes,
AV1 by default, lossy and far smaller), the other observations concatenated as `observation.state`
(in the order user-rl's LeRobot policy runner feeds them, `policies/lerobot_policy.py`), and as
`observation.environment_state` too where there is no camera (ACT needs an image or an environment
state); then `action`, `next.reward`, `next.done`, `complementary_info.is_intervention` (HIL-SERL's
name) and the per-frame `task`.

What ours carry beyond that rides in `user_rl.*` columns, which LeRobot's policies never see: each
non-camera observation exactly as stored (`user_rl.obs.<key>`), terminated and truncated apart, who
acted and whether they held nothing (`user_rl.idle`: such frames still count as interventions in
`complementary_info.is_intervention`, as a person drove), the label and who gave it, the policy's
own proposal when someone else acted, its version, the robot's timestamp, who acted and labelled by
name (`user_rl.actor_person`, `user_rl.label_person`: integer ids, 0 for nobody, named in the
sidecar's "people", since a string per frame is not what LeRobot's features hold cheaply; exports
from before them import as nobody named), and each episode's final
observation (`user_rl.final.<key>`, flattened, on its last frame, zeros elsewhere; never an image
feature, which LeRobot would take for a camera). The buffer's exact spaces, and which (robot, epoch,
episode) each dataset episode is, are kept in `meta/user_rl.json`, so an export imports back
unchanged (`lerobot_import.py`): episode numbers restart at 0 in each epoch (each life of an edge),
so without the epoch two robots' "episode 0"s would merge. Exports written before this layout
(format 1: `observation.<key>` per key, finals as `user_rl.final.observation.*`) import as before.

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
from user_rl.wire.spaces import spaces_to_text
from user_rl.wire.transitions import ACTOR_PERSON, IDLE, LABEL_PERSON, OBS, intervened

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
    ACTOR_PERSON: ("int64", np.uint16),  # ids of the sidecar's "people" (0: nobody named)
    LABEL_PERSON: ("int64", np.uint16),
}
# The robot's timestamp in integer nanoseconds: LeRobot's loader hands float64 columns back as float32,
# which keeps ~2 minutes of precision on a Unix time.
SENSOR_TIME_NS = OURS + "sensor_time_ns"
Progress = Callable[[int, int], None]
# LeRobot's default video codec (as `lerobot-record` writes); SVT-AV1 kills the process (SIGFPE, no
# exception) on frames under about 30 pixels a side, so an export refuses it below this.
DEFAULT_VCODEC = "libsvtav1"
SMALLEST_AV1_SIDE = 32


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


def dataset_features(obs_space: gym.spaces.Dict, action_space: gym.spaces.Box, video: bool = False) -> dict[str, dict]:
    """The LeRobot features of a buffer with these spaces (cameras as videos or as PNG frames)."""
    cameras, state_keys = lerobot_keys(obs_space)
    features: dict[str, dict] = {}
    for key in cameras:
        features[IMAGES + key] = {
            "dtype": "video" if video else "image",
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
            OURS + IDLE: {"dtype": "bool", "shape": (1,), "names": None},
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
    video: bool = False,
    vcodec: str = DEFAULT_VCODEC,
) -> dict:
    """Write the buffer's episodes that `which` admits as a LeRobotDataset at `out` (which must not
    exist); with `video`, each camera as an MP4 encoded with `vcodec`, as `lerobot-record` does."""
    LeRobotDataset = require_lerobot()
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; LeRobot writes a new dataset directory")
    obs_space, action_space = buffer_spaces(buffer_dir)
    if video:
        check_video_codec(obs_space, vcodec)
    total = count_episodes(buffer_dir, which)
    if total == 0:
        raise ValueError(f"{buffer_dir}: no episode matches {which or EpisodeFilter()}")
    fps = fps or export_fps(buffer_dir, which)
    episodes = read_episodes(buffer_dir, which)
    first = next(episodes, None)  # before LeRobot makes a directory
    if first is None:
        raise ValueError(f"{buffer_dir}: the matching episodes' steps are no longer stored (evicted)")
    dataset = LeRobotDataset.create(
        repo_id,
        fps,
        dataset_features(obs_space, action_space, video),
        root=out,
        robot_type=robot_type,
        use_videos=video,
        vcodec=vcodec,
    )
    origins, frames = [], 0  # which (robot, epoch, episode) each dataset episode is
    people: dict[int, str] = {}  # the names of the person ids the frames hold
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
            for column in (ACTOR_PERSON, LABEL_PERSON):
                people.update({i: episode.people.get(i, "") for i in np.unique(episode.steps[column]).tolist() if i})
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
                "people": {str(i): name for i, name in sorted(people.items())},
            }
        )
    )
    return {"episodes": len(origins), "frames": frames, "fps": fps, "root": str(out), "video": video}


def check_video_codec(obs_space: gym.spaces.Dict, vcodec: str) -> None:
    """Refuse, before anything is written, what LeRobot's encoder would fail on: an unknown codec, a
    buffer with no camera to encode, and AV1 on frames so small that SVT-AV1 kills the process."""
    from lerobot.datasets.video_utils import VALID_VIDEO_CODECS

    if vcodec not in VALID_VIDEO_CODECS:
        codecs = ", ".join(sorted(VALID_VIDEO_CODECS))
        raise ValueError(f"unknown video codec {vcodec!r}: LeRobot encodes with {codecs}")
    cameras = lerobot_keys(obs_space)[0]
    if not cameras:
        raise ValueError("--video: the buffer has no camera (HxWxC uint8 observation) to write as a video")
    if vcodec in (DEFAULT_VCODEC, "auto"):
        sides = {key: obs_space[key].shape[:2] for key in cameras}
        small = [f"{key} ({h}x{w})" for key, (h, w) in sides.items() if min(h, w) < SMALLEST_AV1_SIDE]
        if small:
            raise ValueError(
                f"camera {', '.join(small)} is under {SMALLEST_AV1_SIDE} pixels a side, which LeRobot's AV1 "
                f"encoder ({DEFAULT_VCODEC}) crashes on: export with --vcodec h264, or without --video (PNG frames)"
            )


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
            OURS + IDLE: np.array([bool(s[IDLE][i])]),
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


def print_progress(label: str) -> Progress:
    """A progress callback that prints `label: n/total episodes` at most every 2 s, and the last one."""
    shown = [0.0]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - shown[0] >= 2.0:
            shown[0] = now
            print(f"{label}: {done:,}/{total:,} episodes", file=sys.stderr, flush=True)

    return report
