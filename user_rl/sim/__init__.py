"""MuJoCo robots and tasks behind the HAL robot interface, and an adapter for gymnasium envs.

Drivers are found through the `user_rl.robots` entry points (`mujoco_reach`, `gym`), so this
package imports nothing heavy. It only picks headless EGL rendering as the default, because
MuJoCo reads MUJOCO_GL once, when `mujoco` is first imported.
"""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
