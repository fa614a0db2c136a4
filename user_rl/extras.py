"""Optional extras: which package comes with which extra (`pip install -e '.[sim]'`), and the
one-line error a command gives when its extra is missing.

A robot controller installs only the base package (`user-rl[edge]`): no Ray, no MuJoCo. So
those two are imported only inside the functions that need them, and a command that reaches
one on a machine without it says what to install instead of printing a traceback.
"""

from __future__ import annotations

EXTRA_OF_MODULE = {
    "ray": "cluster",
    "mujoco": "sim",
    "aiohttp": "teleop",
}  # top-level module -> the extra that installs it
COMMAND_EXTRAS = {  # what a command needs in all (the missing module's extra is always named)
    "train": ("cluster", "sim"),
    "launch": ("cluster", "sim"),
    "node": ("cluster",),
    "teleop": ("teleop",),
}


def missing_module(exc: BaseException) -> str | None:
    """The optional module whose absence caused `exc` (or an exception it was raised from), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ModuleNotFoundError) and current.name:
            top = current.name.partition(".")[0]
            if top in EXTRA_OF_MODULE:
                return top
        if type(current).__name__ == "DependencyNotInstalled" and "mujoco" in str(current).lower():
            return "mujoco"  # gymnasium's own error for a MuJoCo env without mujoco
        current = current.__cause__ or current.__context__
    return None


def missing_extra_message(command: str, exc: BaseException) -> str | None:
    """ "user-rl train needs the cluster extra (ray is not installed here): pip install -e '.[cluster,sim]'
    in the user-rl checkout", or None when `exc` is not about a missing optional package."""
    module = missing_module(exc)
    if module is None:
        return None
    extra = EXTRA_OF_MODULE[module]
    extras = COMMAND_EXTRAS.get(command, ())
    extras = extras if extra in extras else (extra, *extras)
    return (
        f"user-rl {command} needs the {extra} extra ({module} is not installed here): "
        f"pip install -e '.[{','.join(extras)}]' in the user-rl checkout"
    )


# LeRobot 0.4 (the newest for Python 3.11) pins torch < 2.11 and protobuf < 7, so it cannot share an
# environment with this project's torch: it gets one of its own, with everything else in it too, so
# `.venv-lerobot/bin/user-rl train` runs a LeRobot robot or policy. gym-hil (the `hil` extra: LeRobot's
# MuJoCo Panda envs) pins MuJoCo below 3.9, so it lives there too, not beside this project's MuJoCo.
# The README gives this command; the test suite builds its LeRobot environment with it
# (tests/support/lerobot_env.py).
LEROBOT_ENV_COMMAND = 'python -m venv .venv-lerobot && .venv-lerobot/bin/pip install -e ".[all,smolvla,hil]"'
LEROBOT_MISSING = (
    "the lerobot package is not installed here; LeRobot pins an older torch, so it gets an environment of "
    f"its own: in the user-rl checkout, {LEROBOT_ENV_COMMAND}, then run .venv-lerobot/bin/user-rl"
)
