"""What the teleop page shows of a robot: its cameras, its episode limit, its state by name, and
frames as JPEG. Read from the robot's own attributes where it has them (`state_names`,
`episode_steps`, a gym spec), else plain positions (`state[3]`)."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

STATE_SHOWN = 48  # numbers of a long state vector shown (the page is for people)


def image_keys(obs_space: Any) -> list[str]:
    """Observation keys that are camera images (uint8 HWC)."""
    spaces = getattr(obs_space, "spaces", {})
    return [k for k, s in spaces.items() if s.dtype == np.uint8 and len(s.shape) == 3 and s.shape[-1] in (1, 3)]


def episode_limit(robot: Any) -> int | None:
    """The steps after which the robot's episodes end by themselves, where the robot says (None: it does not)."""
    limit = getattr(robot, "episode_steps", None)
    if limit is None:
        limit = getattr(getattr(getattr(robot, "env", None), "spec", None), "max_episode_steps", None)
    return int(limit) if isinstance(limit, (int, np.integer)) and limit > 0 else None


def jpeg(image: np.ndarray, quality: int = 80) -> bytes:
    bgr = cv2.cvtColor(image, cv2.COLOR_RGB2BGR) if image.shape[-1] == 3 else image
    ok, data = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError(f"could not encode a {image.shape} frame as JPEG")
    return data.tobytes()


def named_state(robot: Any, obs: dict[str, np.ndarray], cameras: list[str]) -> list[tuple[str, float]]:
    """The robot's non-image observation as (name, value): `state_names` for its "state" entry when
    the robot gives them (the sims, LeRobot robots), else `key[i]`."""
    names = getattr(robot, "state_names", None)
    shown: list[tuple[str, float]] = []
    for key, value in obs.items():
        if key in cameras:
            continue
        flat = np.ravel(np.asarray(value, dtype=np.float64))
        labels = names if key == "state" and names is not None and len(names) == flat.size else None
        for i, x in enumerate(flat[: STATE_SHOWN - len(shown)]):
            shown.append((labels[i] if labels else f"{key}[{i}]", round(float(x), 3)))
        if len(shown) >= STATE_SHOWN:
            break
    return shown
