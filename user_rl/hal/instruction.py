"""The instruction a robot is given, as an observation: a task that names its goal per episode
(e.g. which of two targets to reach) puts it under the key `instruction` in every observation.

Its format is the instruction's UTF-8 bytes, zero-padded to a fixed length (a uint8 vector), so it
travels on the wire and sits in the buffer like any other array, changes at each episode, and a
policy reads it without a tokenizer file (the VLA embeds each byte).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

INSTRUCTION = "instruction"
INSTRUCTION_BYTES = 32  # the default length of an instruction observation


def instruction_space(length: int = INSTRUCTION_BYTES) -> gym.spaces.Box:
    return gym.spaces.Box(0, 255, (length,), np.uint8)


def encode_instruction(text: str, length: int = INSTRUCTION_BYTES) -> np.ndarray:
    """`text` as its UTF-8 bytes, zero-padded to `length`."""
    data = text.encode("utf-8")
    if len(data) > length or b"\0" in data:
        raise ValueError(f"instruction {text!r} must fit in {length} bytes and hold no NUL")
    out = np.zeros(length, np.uint8)
    out[: len(data)] = np.frombuffer(data, np.uint8)
    return out


def decode_instruction(array: np.ndarray) -> str:
    """The text of an instruction observation (what people see on the teleop page or in `inspect`)."""
    return bytes(np.asarray(array, np.uint8)).rstrip(b"\0").decode("utf-8", errors="replace")
