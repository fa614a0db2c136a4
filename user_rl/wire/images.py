"""Optional camera compression for transition batches: JPEG or PNG per observation key.

Raw uint8 frames dominate a batch (64 steps of one 128x128 RGB camera are 3 MiB); JPEG at
quality 90 cuts that by about 10x on an uplink that several robots share. Compressed columns
stay plain arrays, so the codec needs no new message type:

    obs/image (N, H, W, C) uint8  ->  obs/image#jpeg  every encoded frame, concatenated (uint8)
                                      obs/image#sizes  encoded bytes per frame (int64)

The learner calls `decode_columns` with the robot's observation space and the batch's declared
row count before validating the batch. Decoding trusts nothing: any inconsistency is a
`WireError("bad_image")` naming the column. What a message may decode to is bounded before a
decoder allocates anything: `count` frames per observation column (at most `count` final
observations), every frame header of the space's size and 8-bit depth, and the total decoded
bytes under the caller's limit (the ingest allows 4x `learner.max_message_mb`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

import cv2
import gymnasium as gym
import numpy as np

from user_rl.wire.codec import WireError
from user_rl.wire.transitions import FINAL_OBS, MAX_BATCH_ROWS, OBS

SIZES = "sizes"
FORMATS = ("jpeg", "png")
_EXTENSION = {"jpeg": ".jpg", "png": ".png"}
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (they carry the frame size); C4, C8 and CC are other segments.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


@dataclass(frozen=True)
class ImageCompression:
    """How one camera travels. `quality` (1..100) applies to JPEG; PNG is lossless and
    `png_level` (0..9) trades edge CPU for size (1 is fast and close to 9 on renders)."""

    format: Literal["jpeg", "png"]
    quality: int = 90
    png_level: int = 1

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"image format must be one of {FORMATS}, got {self.format!r}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"jpeg quality must be in 1..100, got {self.quality}")
        if not 0 <= self.png_level <= 9:
            raise ValueError(f"png_level must be in 0..9, got {self.png_level}")

    def params(self) -> list[int]:
        if self.format == "jpeg":
            return [cv2.IMWRITE_JPEG_QUALITY, self.quality]
        return [cv2.IMWRITE_PNG_COMPRESSION, self.png_level]


def compress_columns(
    columns: Mapping[str, np.ndarray], settings: Mapping[str, ImageCompression]
) -> dict[str, np.ndarray]:
    """Replace `obs/<key>` and `final_obs/<key>` for every key in `settings` (when present
    and non-empty) by their encoded columns; everything else passes through untouched."""
    targets = {prefix + key: s for key, s in settings.items() for prefix in (OBS, FINAL_OBS)}
    out: dict[str, np.ndarray] = {}
    for name, array in columns.items():
        setting = targets.get(name)
        frames = np.asarray(array)
        if setting is None or (frames.ndim > 0 and len(frames) == 0):
            out[name] = array
            continue
        data, sizes = _encode_frames(name, frames, setting)
        out[f"{name}#{setting.format}"] = data
        out[f"{name}#{SIZES}"] = sizes
    return out


def decode_columns(
    columns: Mapping[str, np.ndarray],
    obs_space: gym.spaces.Dict,
    count: int | None = None,
    max_bytes: int | None = None,
) -> dict[str, np.ndarray]:
    """Inverse of `compress_columns`: restore each `<col>` as uint8 (N, *space.shape).

    `count`: the batch's declared rows (`obs/` columns must hold exactly that many frames,
    `final_obs/` at most that many); `max_bytes`: the most all decoded columns may take together."""
    groups: dict[str, dict[str, np.ndarray]] = {}
    for name, array in columns.items():
        if "#" in name:
            base, _, suffix = name.rpartition("#")
            if suffix not in FORMATS and suffix != SIZES:
                raise WireError("bad_image", f"{base}: unknown image format {suffix!r} in column {name!r}")
            groups.setdefault(base, {})[suffix] = array
    for base, parts in groups.items():
        if not any(s in FORMATS for s in parts):
            raise WireError("bad_image", f"{base}: {base}#{SIZES} arrived without its image data column")
    plans = {base: _plan_column(base, parts, columns, obs_space, count) for base, parts in groups.items()}
    decoded_bytes = sum(len(frames) * int(np.prod(shape)) for _, frames, shape in plans.values())
    if max_bytes is not None and decoded_bytes > max_bytes:
        raise WireError(
            "bad_image",
            f"the images would decode to {decoded_bytes / 2**20:.1f} MiB, more than the "
            f"{max_bytes / 2**20:.0f} MiB one message may decode to",
        )
    out: dict[str, np.ndarray] = {}
    for name, array in columns.items():
        base, _, suffix = name.rpartition("#")
        if "#" not in name:
            out[name] = array
        elif suffix in FORMATS:  # decode once, where the data column sits
            out[base] = _decode_frames(base, *plans[base])
    return out


def compressed_bytes(columns: Mapping[str, np.ndarray]) -> int:
    """Total bytes of all arrays, for size reports."""
    return int(sum(np.asarray(a).nbytes for a in columns.values()))


# -- encoding (edge side: bad input is a programming error, so ValueError) --------------------


def _encode_frames(name: str, frames: np.ndarray, setting: ImageCompression) -> tuple[np.ndarray, np.ndarray]:
    channels = frames.shape[3] if frames.ndim == 4 else 1
    if frames.dtype != np.uint8 or frames.ndim not in (3, 4) or channels not in (1, 3):
        raise ValueError(f"{name}: images must be uint8 (N, H, W[, 1|3]), got {frames.dtype}{frames.shape}")
    color = channels == 3
    ext, params = _EXTENSION[setting.format], setting.params()
    encoded: list[np.ndarray] = []
    for frame in frames:
        # OpenCV writes BGR; swapping keeps JPEG's chroma handling on the right channels.
        image = cv2.cvtColor(frame, cv2.COLOR_RGB2BGR) if color else frame.reshape(frame.shape[:2])
        ok, buf = cv2.imencode(ext, image, params)
        if not ok:
            raise ValueError(f"{name}: OpenCV could not encode a frame as {setting.format}")
        encoded.append(buf.reshape(-1))
    sizes = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
    return np.concatenate(encoded), sizes


# -- decoding (learner side: hostile input is a WireError) ------------------------------------


def _plan_column(
    base: str,
    parts: dict[str, np.ndarray],
    columns: Mapping[str, np.ndarray],
    obs_space: gym.spaces.Dict,
    count: int | None,
) -> tuple[str, list[np.ndarray], tuple[int, ...]]:
    """(format, encoded frames, image shape) of one compressed column, every header checked:
    nothing is decoded or allocated beyond views into the message yet."""

    def bad(detail: str) -> WireError:
        return WireError("bad_image", f"{base}: {detail}")

    formats = [s for s in parts if s in FORMATS]
    if len(formats) != 1:
        raise bad(f"several encodings {sorted(formats)} for one column")
    fmt = formats[0]
    if SIZES not in parts:
        raise bad(f"{base}#{fmt} arrived without {base}#{SIZES}")
    if base in columns:
        raise bad("arrived both raw and compressed")
    shape = _image_shape(base, obs_space)
    if shape is None:
        raise bad("is not a uint8 image (H, W) or (H, W, 1|3) in the observation space")
    data, sizes = parts[fmt], parts[SIZES]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1:
        raise bad(f"{base}#{fmt} must be a 1-D uint8 array")
    if not isinstance(sizes, np.ndarray) or sizes.dtype.kind not in "iu" or sizes.ndim != 1:
        raise bad(f"{base}#{SIZES} must be a 1-D integer array")
    if len(sizes) > MAX_BATCH_ROWS:
        raise bad(f"{len(sizes)} frames, more than {MAX_BATCH_ROWS}")
    if count is not None:
        final = base.startswith(FINAL_OBS)
        if (final and len(sizes) > count) or (not final and len(sizes) != count):
            raise bad(f"{len(sizes)} frames in a batch of {count} rows")
    lengths = [int(s) for s in sizes]
    if any(s < 0 for s in lengths):
        raise bad("negative frame size")
    if sum(lengths) != len(data):
        raise bad(f"frame sizes sum to {sum(lengths)} but {base}#{fmt} holds {len(data)} bytes")
    h, w = shape[0], shape[1]
    starts = [0, *accumulate(lengths)]
    frames = [data[a:b] for a, b in zip(starts, starts[1:])]
    for i, frame in enumerate(frames):  # all headers first: cheap, and nothing is allocated yet
        if _declared_size(frame, fmt) != (h, w):
            raise bad(f"frame {i} is not an 8-bit {fmt} image of {h}x{w}")
    return fmt, frames, shape


def _decode_frames(base: str, fmt: str, frames: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """Decode checked frames into one array allocated once (no per-frame list, no stack copy)."""
    color = len(shape) == 3 and shape[2] == 3
    expected = (shape[0], shape[1], 3) if color else shape[:2]
    out = np.empty((len(frames), *shape), np.uint8)
    for i, frame in enumerate(frames):
        try:
            image = cv2.imdecode(frame, cv2.IMREAD_UNCHANGED)
        except Exception as exc:  # noqa: BLE001 - any decoder failure is the peer's fault
            raise WireError("bad_image", f"{base}: frame {i} cannot be decoded ({type(exc).__name__})") from None
        if image is None:
            raise WireError("bad_image", f"{base}: frame {i} cannot be decoded")
        if image.dtype != np.uint8 or image.shape != expected:
            raise WireError(
                "bad_image", f"{base}: frame {i} decodes to {image.dtype}{image.shape}, expected uint8{expected}"
            )
        if color:
            cv2.cvtColor(image, cv2.COLOR_BGR2RGB, dst=out[i])
        else:
            out[i] = image.reshape(shape)
    return out


def _image_shape(base: str, obs_space: gym.spaces.Dict) -> tuple[int, ...] | None:
    prefix = next((p for p in (OBS, FINAL_OBS) if base.startswith(p)), None)
    if prefix is None or not isinstance(obs_space, gym.spaces.Dict):
        return None
    space = obs_space.spaces.get(base[len(prefix) :])
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8:
        return None
    shape = tuple(space.shape)
    if len(shape) == 2 or (len(shape) == 3 and shape[2] in (1, 3)):
        return shape
    return None


def _declared_size(frame: np.ndarray, fmt: str) -> tuple[int, int] | None:
    """(height, width) from an 8-bit PNG or JPEG header, or None when the header is not one
    (a 16-bit image would decode to twice the bytes the space allows)."""
    head = frame[:65536].tobytes()  # SOF sits after the small headers cv2 writes
    if fmt == "png":
        if len(head) < 25 or not head.startswith(_PNG_MAGIC) or head[12:16] != b"IHDR" or head[24] != 8:
            return None
        return int.from_bytes(head[20:24], "big"), int.from_bytes(head[16:20], "big")
    if not head.startswith(b"\xff\xd8"):
        return None
    i = 2
    while i + 4 <= len(head):  # walk the segments until the start of frame
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # segments without a length
            i += 2
            continue
        if marker in (0xD8, 0xD9, 0xDA):  # SOI again, EOI or scan data before any frame header
            return None
        if marker in _JPEG_SOF:
            if i + 9 > len(head) or head[i + 4] != 8:  # sample precision: 8 bits
                return None
            return int.from_bytes(head[i + 5 : i + 7], "big"), int.from_bytes(head[i + 7 : i + 9], "big")
        i += 2 + int.from_bytes(head[i + 2 : i + 4], "big")
    return None
