"""MuJoCo reads MUJOCO_GL when first imported; choose headless EGL before any test imports it."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
