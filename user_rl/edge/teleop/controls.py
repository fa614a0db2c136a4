"""How keys and a gamepad move a robot: one mapping from input to action dimensions, made here
and sent to the page, which both uses it and shows it (so what is shown is what is used).

Each action dimension gets a pair of keys (more / less) and, on a standard gamepad, a stick axis
(the first four dimensions) or a pair of buttons. A robot with a gripper says which dimension
it is (`gripper_index` on the robot); that dimension gets its own keys and buttons, and the page
shows open / close buttons for it. A held key sends a motion command of +-`speed` for its
dimension (a stick its deflection, in [-1, 1]); the edge turns it into the robot's action from
where the robot is (`edge/motion.py`): `speed` of the per-step limit for an arm of absolute
position goals, of half the action range for a relative one. Nothing held holds still.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import gymnasium as gym

KEY_PAIRS = [
    ("KeyD", "KeyA"),
    ("KeyW", "KeyS"),
    ("KeyE", "KeyQ"),
    ("KeyL", "KeyJ"),
    ("KeyI", "KeyK"),
    ("KeyO", "KeyU"),
    ("ArrowRight", "ArrowLeft"),
    ("ArrowUp", "ArrowDown"),
]
GRIPPER_KEYS = ("KeyF", "KeyR")  # close, open
# Standard gamepad layout: axes 0/1 left stick x/y, 2/3 right stick x/y (y is down-positive: flipped).
GAMEPAD_AXES = [(0, 1.0), (1, -1.0), (2, 1.0), (3, -1.0)]
GAMEPAD_BUTTON_PAIRS = [(7, 6), (5, 4), (12, 13), (15, 14)]  # triggers, bumpers, d-pad
GRIPPER_BUTTONS = (0, 1)  # A closes, B opens


@dataclass(frozen=True)
class OperatorKey:
    """A key (and gamepad button) for one of a person's actions other than driving: no mouse needed."""

    action: str  # what the page does: the message it sends, or a page-side action (undo, rearm)
    key: str  # KeyboardEvent.code
    button: int | None  # standard gamepad button
    label: str  # what the page shows


# None of these keys drives (KEY_PAIRS, GRIPPER_KEYS), so a person can hold a motion key and label.
# Escape is the e-stop, from anywhere on the page (a text field too), like a physical button.
OPERATOR_KEYS = [
    OperatorKey("take_over", "Space", 3, "take over / hand back"),  # Y
    OperatorKey("success", "Enter", 9, "mark success (ends the episode)"),  # Start
    OperatorKey("failure", "Backspace", 8, "mark failure (ends the episode)"),  # Back
    OperatorKey("undo", "KeyZ", 2, "undo the label not yet sent"),  # X
    OperatorKey("discard", "KeyX", None, "discard the episode (re-record)"),
    OperatorKey("reset", "KeyN", None, "reset: end the episode, start a new one"),
    OperatorKey("estop", "Escape", 16, "EMERGENCY STOP"),  # Home / guide
    OperatorKey("rearm", "KeyG", None, "re-arm… (asks for the operator credential)"),
]


@dataclass(frozen=True)
class DimensionControl:
    """How one action dimension is driven."""

    index: int
    name: str
    plus_key: str | None
    minus_key: str | None
    axis: int | None = None  # gamepad axis, scaled by axis_sign
    axis_sign: float = 1.0
    plus_button: int | None = None  # gamepad buttons, when no axis is left
    minus_button: int | None = None


def key_label(code: str | None) -> str:
    """ "KeyD" -> "D", "ArrowUp" -> "↑" (what a person reads on the page)."""
    if code is None:
        return "-"
    named = {"ArrowUp": "↑", "ArrowDown": "↓", "ArrowLeft": "←", "ArrowRight": "→", "Escape": "Esc"}
    return named.get(code, code.removeprefix("Key"))


def control_map(
    action_space: gym.spaces.Box, gripper_index: int | None = None, names: list[str] | None = None
) -> list[DimensionControl]:
    """The controls of every action dimension, in order."""
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise ValueError(f"teleop drives a flat Box action space; this robot's is {action_space}")
    dims = action_space.shape[0]
    if gripper_index is not None and not 0 <= gripper_index < dims:
        raise ValueError(f"gripper_index {gripper_index} is outside the robot's {dims} action dimensions")
    controls, keys, axes, buttons = [], iter(KEY_PAIRS), iter(GAMEPAD_AXES), iter(GAMEPAD_BUTTON_PAIRS)
    for i in range(dims):
        name = names[i] if names and i < len(names) else f"action[{i}]"
        if i == gripper_index:
            controls.append(
                DimensionControl(
                    i, "gripper", *GRIPPER_KEYS, plus_button=GRIPPER_BUTTONS[0], minus_button=GRIPPER_BUTTONS[1]
                )
            )
            continue
        plus, minus = next(keys, (None, None))
        axis = next(axes, None)
        if axis is not None:
            controls.append(DimensionControl(i, name, plus, minus, axis=axis[0], axis_sign=axis[1]))
        else:
            plus_button, minus_button = next(buttons, (None, None))
            controls.append(DimensionControl(i, name, plus, minus, plus_button=plus_button, minus_button=minus_button))
    return controls


def mapping_for_page(controls: list[DimensionControl], speed: float) -> dict:
    """What the page needs to drive and to show the mapping (driving and the operator's keys)."""
    return {
        "speed": speed,
        "operator": [{**asdict(k), "key_label": key_label(k.key)} for k in OPERATOR_KEYS],
        "dimensions": [
            {**asdict(c), "plus_label": key_label(c.plus_key), "minus_label": key_label(c.minus_key)} for c in controls
        ],
    }
