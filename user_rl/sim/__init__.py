"""MuJoCo robots and tasks behind the HAL robot interface, and an adapter for gymnasium envs.

Drivers are found through the `user_rl.robots` entry points (`mujoco_reach`, `gym`), so this
package imports nothing heavy. `mujoco_reach` and gymnasium's MuJoCo envs need the sim extra
(`pip install -e '.[sim]'`); `gym` with a classic-control env such as Pendulum-v1 runs on the
base install, which is how a robot controller without MuJoCo can still test its edge. It only picks
headless EGL rendering as the default, because MuJoCo reads MUJOCO_GL once, when `mujoco` is first imported.
"""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
