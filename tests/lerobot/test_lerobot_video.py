"""Video datasets both ways, and imports that fail without leaving anything behind.

LeRobot records cameras as video by default (AV1 through PyAV); its loader decodes them with
torchcodec, which needs FFmpeg's shared libraries (README: `apt-get install ffmpeg`), or with PyAV.
A dataset recorded that way must import with its cameras, our export must write videos LeRobot's
loader decodes with its defaults, and an import that cannot read something must say what and leave
no half-made buffer. Everything runs in the LeRobot environment, on real files; video is lossy, so
frames are compared within a tolerance measured on these smooth test images.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np

from tests.lerobot.harness import record_with_lerobot, run_in_lerobot, user_rl_in_lerobot
from tests.lerobot.test_lerobot_dataset import EPISODES, write_buffer
from user_rl.cloud.buffer.episodes import buffer_spaces, read_episodes

SIDE = 32  # LeRobot's AV1 encoder crashes the process on frames under ~30 pixels a side
CAMERA_SPACE = gym.spaces.Dict(
    {"top": gym.spaces.Box(0, 255, (SIDE, SIDE, 3), np.uint8), "state": gym.spaces.Box(-10.0, 10.0, (3,), np.float32)}
)
JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "gripper")
MEAN_ERROR = 4.0  # mean absolute pixel error allowed after AV1 at LeRobot's settings (crf 30)


def smooth_image(level: float) -> np.ndarray:
    """Gradients and a bright square, shifted by `level`: what a codec keeps well, unlike noise."""
    rows, cols = np.meshgrid(np.linspace(0, 120, SIDE), np.linspace(0, 120, SIDE), indexing="ij")
    image = np.stack([rows + level, cols + level / 2, np.full_like(rows, 60 + level)], -1)
    image[8:16, 8:16] = 230
    return np.clip(image, 0, 255).astype(np.uint8)


def smooth_observation(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"top": smooth_image(rng.uniform(0, 100)), "state": rng.uniform(-10, 10, 3).astype(np.float32)}


def assert_close_images(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == np.uint8, (what, got.shape, got.dtype)
    error = np.abs(got.astype(float) - want.astype(float)).mean()
    assert error <= MEAN_ERROR, f"{what}: mean pixel error {error:.2f} > {MEAN_ERROR}"


def record_video_dataset(lerobot_python: Path, root: Path, text: bool = False) -> dict[str, np.ndarray]:
    """Two episodes as `lerobot-record` writes them by default: the camera as AV1 video."""
    lengths = (12, 10)
    levels = [8.0 * step + 40 * episode for episode, length in enumerate(lengths) for step in range(length)]
    images = np.stack([smooth_image(level) for level in levels])
    recorded = record_with_lerobot(
        lerobot_python, root, images, [(length, "pick the cube") for length in lengths], JOINTS, video=True, text=text
    )
    assert list(root.glob("videos/observation.images.front/*/*.mp4")), "LeRobot wrote no video"
    return recorded


def import_buffer(lerobot_python: Path, dataset: Path, buffer: Path, *flags: str, check: bool = True):
    return user_rl_in_lerobot(lerobot_python, "buffer", "import", str(dataset), str(buffer), *flags, check=check)


def test_a_video_dataset_lerobot_recorded_imports_with_its_cameras(lerobot_python: Path, tmp_path: Path) -> None:
    recorded = record_video_dataset(lerobot_python, tmp_path / "dataset")
    for backend in ("torchcodec", "pyav"):  # LeRobot's default (system FFmpeg), and PyAV's own FFmpeg
        buffer = tmp_path / f"buffer-{backend}"
        import_buffer(lerobot_python, tmp_path / "dataset", buffer, "--video-backend", backend)
        obs_space, _ = buffer_spaces(buffer)
        assert obs_space["front"] == gym.spaces.Box(0, 255, (32, 32, 3), np.uint8), obs_space
        episodes = list(read_episodes(buffer))
        assert [len(e) for e in episodes] == [12, 10]
        steps = {name: np.concatenate([e.steps[name] for e in episodes]) for name in episodes[0].steps}
        assert_close_images(steps["obs/front"], recorded["front"], f"front decoded by {backend}")
        np.testing.assert_array_equal(steps["obs/state"], recorded["state"])
        np.testing.assert_array_equal(steps["action"], recorded["action"])


LOAD_VIDEO_WITH_LEROBOT = """
import json, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
dataset = LeRobotDataset("local/user-rl", root=sys.argv[1])  # LeRobot's default video backend
frames = [dataset[i] for i in range(len(dataset))]
np.save(sys.argv[2], np.stack([np.asarray(f["observation.images.top"]) for f in frames]))
print(json.dumps({"backend": dataset.video_backend, "video_keys": dataset.meta.video_keys,
                  "info": dataset.meta.info["features"]["observation.images.top"]["info"]}))
"""


def test_an_export_writes_videos_that_lerobots_loader_decodes(lerobot_python: Path, tmp_path: Path) -> None:
    write_buffer(tmp_path / "buffer", CAMERA_SPACE, smooth_observation, segment_mb=1)
    original = list(read_episodes(tmp_path / "buffer"))
    exported = user_rl_in_lerobot(
        lerobot_python, "buffer", "export", str(tmp_path / "buffer"), str(tmp_path / "dataset"), "--video"
    )
    assert "cameras as libsvtav1 video" in exported.stdout, exported.stdout
    assert not list((tmp_path / "dataset").rglob("*.png")), "a video export keeps no PNG frames"
    loaded = json.loads(
        run_in_lerobot(
            lerobot_python, "-c", LOAD_VIDEO_WITH_LEROBOT, str(tmp_path / "dataset"), str(tmp_path / "top.npy")
        ).stdout.splitlines()[-1]
    )
    assert loaded["backend"] == "torchcodec" and loaded["video_keys"] == ["observation.images.top"], loaded
    assert loaded["info"]["video.codec"] == "av1" and loaded["info"]["video.fps"] == 20, loaded
    decoded = np.rint(np.load(tmp_path / "top.npy").transpose(0, 2, 3, 1) * 255).astype(np.uint8)
    steps = {name: np.concatenate([e.steps[name] for e in original]) for name in original[0].steps}
    assert_close_images(decoded, steps["obs/top"], "top as LeRobot decodes it")

    # Our import of our own video export: the same episodes, its pixels within the codec's error.
    import_buffer(lerobot_python, tmp_path / "dataset", tmp_path / "imported")
    back = list(read_episodes(tmp_path / "imported"))
    assert [(e.robot, e.number, len(e), e.status) for e in back] == [
        (e.robot, e.number, len(e), e.status) for e in original
    ]
    assert len(back) == 2 * EPISODES
    for a, b in zip(original, back):
        for name, column in a.steps.items():
            if name == "obs/top":
                assert_close_images(b.steps[name], column, f"{a.robot} episode {a.number}")
            else:
                np.testing.assert_array_equal(b.steps[name], column, err_msg=f"{a.robot} episode {a.number}: {name}")
        if a.final_obs is not None:  # finals ride in their own columns, exactly
            np.testing.assert_array_equal(b.final_obs["top"], a.final_obs["top"])


def test_a_video_export_refuses_what_the_encoder_would_crash_on(lerobot_python: Path, tmp_path: Path) -> None:
    """SVT-AV1 kills the process (SIGFPE) on 8x8 frames: the export must refuse before LeRobot runs."""
    write_buffer(tmp_path / "buffer")  # an 8x8 camera
    args = ["buffer", "export", str(tmp_path / "buffer"), str(tmp_path / "dataset"), "--video"]
    refused = user_rl_in_lerobot(lerobot_python, *args, check=False)
    assert refused.returncode == 2, refused.stderr
    assert "top (8x8)" in refused.stderr and "--vcodec h264" in refused.stderr, refused.stderr
    assert not (tmp_path / "dataset").exists()
    user_rl_in_lerobot(lerobot_python, *args, "--vcodec", "h264")  # the codec the error names does encode it
    assert list((tmp_path / "dataset").glob("videos/observation.images.top/*/*.mp4"))


def test_an_import_that_cannot_read_something_says_what_and_leaves_nothing(
    lerobot_python: Path, tmp_path: Path
) -> None:
    # A feature a buffer cannot hold is named, not dropped.
    record_video_dataset(lerobot_python, tmp_path / "with-text", text=True)
    refused = import_buffer(lerobot_python, tmp_path / "with-text", tmp_path / "buffer", check=False)
    assert refused.returncode == 2 and "observation.language" in refused.stderr, refused.stderr
    assert "remove_feature" in refused.stderr
    assert not (tmp_path / "buffer").exists()

    # A video cut short (a recording whose disk filled): found while decoding, once the import's
    # buffer was made; that buffer is gone again.
    record_video_dataset(lerobot_python, tmp_path / "dataset")
    video = next((tmp_path / "dataset").glob("videos/observation.images.front/*/*.mp4"))
    whole = video.read_bytes()
    video.write_bytes(whole[: len(whole) * 2 // 3])
    refused = import_buffer(lerobot_python, tmp_path / "dataset", tmp_path / "buffer", check=False)
    assert refused.returncode == 2, refused.stderr
    assert "cannot decode observation.images.front of episode 0" in refused.stderr, refused.stderr
    assert "torchcodec video backend" in refused.stderr and "apt-get install ffmpeg" not in refused.stderr
    assert not (tmp_path / "buffer").exists() and [p.name for p in tmp_path.iterdir() if "importing" in p.name] == []

    # Mended, the same command imports it: nothing was left to say "holds a buffer already".
    video.write_bytes(whole)
    import_buffer(lerobot_python, tmp_path / "dataset", tmp_path / "buffer")
    assert [len(e) for e in read_episodes(tmp_path / "buffer")] == [12, 10]
