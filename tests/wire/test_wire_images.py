"""Camera compression: PNG is exact, JPEG is close and small, and every inconsistent or hostile
compressed column is a WireError('bad_image') that names the column."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import WireError, decode, encode, envelope
from user_rl.wire.images import ImageCompression, compress_columns, compressed_bytes, decode_columns

H = W = 128
SPACE = gym.spaces.Dict(
    {
        "image": gym.spaces.Box(0, 255, (H, W, 3), np.uint8),
        "wrist": gym.spaces.Box(0, 255, (32, 48, 1), np.uint8),
        "depth": gym.spaces.Box(0, 255, (32, 48), np.uint8),
        "state": gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
    }
)
JPEG = ImageCompression("jpeg", quality=90)
PNG = ImageCompression("png")


def render(n: int, h: int = H, w: int = W) -> np.ndarray:
    """Smooth frames like a simple MuJoCo scene: colour gradients, a shaded floor, a soft ball."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    frames = []
    for i in range(n):
        cx, cy, r = w * (0.3 + 0.05 * i), h * 0.45, h * 0.15
        ball = np.clip(1.0 - np.hypot(x - cx, y - cy) / r, 0.0, 1.0)
        red = 60 + 120 * x / w + 150 * ball
        green = 80 + 100 * y / h + 40 * ball
        blue = np.where(y > h * 0.6, 140 - 60 * (y - h * 0.6) / h, 200 - 40 * y / h)
        frames.append(np.stack([red, green, blue], axis=-1))
    return np.clip(np.stack(frames), 0, 255).astype(np.uint8)


def batch(n: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "obs/image": render(n),
        "obs/wrist": rng.integers(0, 256, (n, 32, 48, 1), dtype=np.uint8),
        "obs/depth": rng.integers(0, 256, (n, 32, 48), dtype=np.uint8),
        "obs/state": rng.uniform(-1, 1, (n, 4)).astype(np.float32),
        "reward": rng.normal(size=n).astype(np.float32),
        "final_obs/image": render(1),
        "final_obs/state": np.zeros((1, 4), np.float32),
        "final_row": np.array([n - 1], np.int64),
    }


def test_png_round_trip_is_exact_for_colour_and_grey() -> None:
    columns = batch()
    packed = compress_columns(columns, {"image": PNG, "wrist": PNG, "depth": PNG})
    for col in ("obs/image", "final_obs/image", "obs/wrist", "obs/depth"):
        assert col not in packed
        assert packed[f"{col}#png"].dtype == np.uint8 and packed[f"{col}#png"].ndim == 1
        assert packed[f"{col}#sizes"].dtype == np.int64
        assert packed[f"{col}#sizes"].sum() == len(packed[f"{col}#png"])
    restored = decode_columns(packed, SPACE)
    assert list(restored) == list(columns)  # decoded columns take the place of the raw ones
    for name, array in columns.items():
        assert restored[name].dtype == array.dtype
        np.testing.assert_array_equal(restored[name], array)


def test_jpeg_is_close_and_small() -> None:
    columns = batch(8)
    packed = compress_columns(columns, {"image": JPEG})
    restored = decode_columns(packed, SPACE)
    for col in ("obs/image", "final_obs/image"):
        assert restored[col].shape == columns[col].shape and restored[col].dtype == np.uint8
        error = np.abs(restored[col].astype(np.int16) - columns[col]).mean(axis=(0, 1, 2))
        assert error.max() < 3.0, error  # per channel: a swapped R/B would be far off
        ratio = len(packed[f"{col}#jpeg"]) / columns[col].nbytes
        assert ratio < 0.25, ratio
    assert compressed_bytes(packed) < 0.5 * compressed_bytes(columns)


def test_grey_jpeg_with_and_without_channel_axis() -> None:
    grey = render(3, 32, 48)[..., 1]
    packed = compress_columns({"obs/wrist": grey[..., None], "obs/depth": grey}, {"wrist": JPEG, "depth": JPEG})
    restored = decode_columns(packed, SPACE)
    assert restored["obs/wrist"].shape == (3, 32, 48, 1)
    assert restored["obs/depth"].shape == (3, 32, 48)
    assert np.abs(restored["obs/depth"].astype(np.int16) - grey).mean() < 3.0


def test_only_configured_non_empty_columns_change() -> None:
    columns = batch()
    columns["final_obs/image"] = np.zeros((0, H, W, 3), np.uint8)  # no episode ended
    packed = compress_columns(columns, {"image": JPEG, "not_there": PNG})
    assert set(packed) == {
        "obs/image#jpeg",
        "obs/image#sizes",
        "obs/wrist",
        "obs/depth",
        "obs/state",
        "reward",
        "final_obs/image",
        "final_obs/state",
        "final_row",
    }
    for name in ("obs/wrist", "obs/state", "reward", "final_obs/image", "final_row"):
        assert packed[name] is columns[name]
    restored = decode_columns(packed, SPACE)
    assert restored["final_obs/image"] is columns["final_obs/image"]
    assert decode_columns(columns, SPACE) == columns  # nothing compressed: all pass through


def test_compressed_columns_survive_the_codec() -> None:
    columns = batch()
    packed = compress_columns(columns, {"image": JPEG, "wrist": PNG})
    frames = [bytes(f) for f in encode(envelope("arm-0", batch=pb.TransitionBatch(seq=1)), packed)]
    arrays = decode(frames).arrays  # read-only views into the received frames
    restored = decode_columns(arrays, SPACE)
    np.testing.assert_array_equal(restored["obs/wrist"], columns["obs/wrist"])
    assert np.abs(restored["obs/image"].astype(np.int16) - columns["obs/image"]).mean() < 3.0


def test_settings_and_edge_inputs_are_checked() -> None:
    with pytest.raises(ValueError):
        ImageCompression("webp")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ImageCompression("jpeg", quality=0)
    with pytest.raises(ValueError):
        ImageCompression("png", png_level=10)
    with pytest.raises(ValueError, match="obs/state"):
        compress_columns({"obs/state": np.zeros((2, 4, 4, 4), np.uint8)}, {"state": PNG})
    with pytest.raises(ValueError, match="obs/image"):
        compress_columns({"obs/image": np.zeros((2, 8, 8, 3), np.float32)}, {"image": PNG})


# -- hostile input ---------------------------------------------------------------------------


def packed_image(fmt: str = "jpeg", n: int = 3) -> dict[str, np.ndarray]:
    setting = ImageCompression(fmt)  # type: ignore[arg-type]
    return compress_columns({"obs/image": render(n)}, {"image": setting})


def headers_only(cols: dict[str, np.ndarray]) -> None:
    """Keep frame 0's headers up to its start-of-frame segment, then end: nothing to decode.
    (Garbage scan data would not do: libjpeg decodes it to garbage pixels with a warning.)"""
    frame = cols["obs/image#jpeg"][: cols["obs/image#sizes"][0]].tobytes()
    sof = frame.index(b"\xff\xc0")
    cut = sof + 2 + int.from_bytes(frame[sof + 2 : sof + 4], "big")
    first = np.frombuffer(frame[:cut] + b"\xff\xd9", np.uint8)
    cols["obs/image#jpeg"] = np.concatenate([first, cols["obs/image#jpeg"][len(frame) :]])
    resize(cols, lambda s: [len(first), s[1], s[2]])


def swap(cols: dict[str, np.ndarray], old: str, new: str) -> None:
    cols[new] = cols.pop(old)


def noise(n: int) -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)


def resize(cols: dict[str, np.ndarray], change) -> None:
    cols["obs/image#sizes"] = np.array(change([int(s) for s in cols["obs/image#sizes"]]), np.int64)


def grey_frames(cols: dict[str, np.ndarray]) -> None:
    """Right size, right format, one channel where the space has three."""
    cols.update(compress_columns({"obs/image": render(3)[..., 0]}, {"image": JPEG}))


def other_size(cols: dict[str, np.ndarray]) -> None:
    cols.update(compress_columns({"obs/image": render(3, 64, 64)}, {"image": JPEG}))


def truncate_last(cols: dict[str, np.ndarray]) -> None:
    cols["obs/image#jpeg"] = cols["obs/image#jpeg"][:-200]
    resize(cols, lambda s: [s[0], s[1], s[2] - 200])


HOSTILE = {
    "unknown_format": lambda c: swap(c, "obs/image#jpeg", "obs/image#webp"),
    "sizes_too_small": lambda c: c.update({"obs/image#sizes": c["obs/image#sizes"] - 1}),
    "sizes_too_large": lambda c: c.update({"obs/image#sizes": c["obs/image#sizes"] + 1}),
    "negative_size": lambda c: resize(c, lambda s: [s[0] + 2 * s[1], -s[1], s[2]]),  # sum still right
    "huge_size": lambda c: c.update({"obs/image#sizes": np.array([2**63 - 1, 2**63 - 1, 2], np.int64)}),
    "float_sizes": lambda c: c.update({"obs/image#sizes": c["obs/image#sizes"].astype(np.float64)}),
    "sizes_2d": lambda c: c.update({"obs/image#sizes": c["obs/image#sizes"][None]}),
    "data_not_uint8": lambda c: c.update({"obs/image#jpeg": c["obs/image#jpeg"].view(np.int8)}),
    "zero_size_frame": lambda c: resize(c, lambda s: [0, s[1], s[0] + s[2]]),
    "random_bytes": lambda c: c.update({"obs/image#jpeg": noise(len(c["obs/image#jpeg"]))}),
    "headers_only": headers_only,
    "truncated_frame": truncate_last,
    "png_labelled_jpeg": lambda c: swap(c, "obs/image#jpeg", "obs/image#png"),
    "wrong_frame_size": other_size,
    "grey_frames_for_colour_space": grey_frames,
    "sizes_without_data": lambda c: c.pop("obs/image#jpeg"),
    "data_without_sizes": lambda c: c.pop("obs/image#sizes"),
    "two_encodings": lambda c: c.update({"obs/image#png": c["obs/image#jpeg"]}),
    "raw_and_compressed": lambda c: c.update({"obs/image": render(3)}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_columns_raise_bad_image_naming_the_column(case: str) -> None:
    cols = packed_image("png" if case == "png_labelled_jpeg" else "jpeg")
    if case == "png_labelled_jpeg":
        swap(cols, "obs/image#png", "obs/image#jpeg")  # PNG bytes under a #jpeg name
    else:
        HOSTILE[case](cols)
    with pytest.raises(WireError) as info:
        decode_columns(cols, SPACE)
    assert info.value.reason == "bad_image" and "obs/image" in str(info.value)


@pytest.mark.parametrize("name", ["obs/state#png", "obs/missing#png", "reward#png", "final_obs/state#png"])
def test_compressed_column_for_a_non_image_key(name: str) -> None:
    cols = packed_image("png")
    cols = {name: cols["obs/image#png"], name.replace("#png", "#sizes"): cols["obs/image#sizes"]}
    with pytest.raises(WireError) as info:
        decode_columns(cols, SPACE)
    assert info.value.reason == "bad_image" and name.split("#")[0] in str(info.value)


def test_random_garbage_only_ever_raises_wire_error() -> None:
    rng = np.random.default_rng(7)
    good = packed_image("jpeg", n=2)
    frame0 = good["obs/image#jpeg"][: good["obs/image#sizes"][0]]
    for _ in range(300):
        data = frame0.copy()
        idx = rng.integers(0, len(data), rng.integers(1, 20))
        data[idx] = rng.integers(0, 256, len(idx), dtype=np.uint8)
        cut = int(rng.integers(1, len(data) + 1))
        cols = {"obs/image#jpeg": data[:cut], "obs/image#sizes": np.array([cut], np.int64)}
        try:
            out = decode_columns(cols, SPACE)
        except WireError as err:
            assert err.reason == "bad_image"
        else:
            assert out["obs/image"].shape == (1, H, W, 3)
