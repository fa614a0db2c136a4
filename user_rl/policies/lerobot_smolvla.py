"""What LeRobot's SmolVLA needs beyond ACT and diffusion in `LeRobotChunkActor` (lerobot_policy.py):
its config's checks, its language input, and the flow it integrates (what DSRL steers).

    policy:
      type: lerobot
      chunk: 50                          # SmolVLA's chunk_size
      task: pick up the cube             # what it is told when the robot gives no `instruction`
      lerobot: {path: /models/smolvla_base, vlm_model_name: /models/SmolVLM2-500M-Video-Instruct,
                load_vlm_weights: false, n_action_steps: 10}

SmolVLA reads camera images (at least one; in [0, 1], which it maps to [-1, 1] itself), the robot's
state padded to `max_state_dim`, and a task as tokens of its VLM's tokenizer. The task is the
robot's `instruction` observation (uint8 bytes, zero-padded: `user_rl.hal.instruction`) where it has
one, else `policy.task`; as LeRobot's SmolVLA pre-processor does, a newline ends it before the
tokenizer (loaded with the VLM from `vlm_model_name`) pads it as `pad_language_to` says.

It denoises actions padded to `max_action_dim` by `num_steps` Euler steps from Gaussian noise of
(chunk_size, max_action_dim), so its chunk is a deterministic function of that noise: what DSRL
steers (`noise_shape`), cut to the executed actions and the robot's action size.
"""

from __future__ import annotations

from typing import Any

import torch

INSTRUCTION = "instruction"  # the observation key of a robot's instruction (user_rl/hal/instruction.py)
LANGUAGE_TOKENS, LANGUAGE_MASK = "observation.language.tokens", "observation.language.attention_mask"


def check(config: Any, cameras: list[str], state_dim: int, action_dim: int) -> None:
    """A SmolVLA config fits this robot: a camera to look through, the state and action within its padding."""
    if not cameras:
        raise ValueError(
            "policy.lerobot: SmolVLA reads at least one camera image; this robot has none (reach: obs_mode image)"
        )
    for name, size, padded in (
        ("state", state_dim, config.max_state_dim),
        ("action", action_dim, config.max_action_dim),
    ):
        if size > padded:
            raise ValueError(
                f"policy.lerobot.max_{name}_dim: SmolVLA pads the {name} to {padded} values; this robot's has {size}"
            )
    if config.adapt_to_pi_aloha:
        raise ValueError("policy.lerobot.adapt_to_pi_aloha: the Aloha conversions are not supported here")


def task_texts(obs: dict[str, torch.Tensor], task: str, rows: int) -> list[str]:
    """Each row's task, ending in a newline (LeRobot's SmolVLANewLineProcessor): the instruction
    observation's text where the robot gives one, else `task`."""
    if INSTRUCTION in obs:
        found = obs[INSTRUCTION].to("cpu", torch.uint8).numpy()
        texts = [bytes(row).rstrip(b"\0").decode("utf-8", errors="replace") for row in found]
    else:
        texts = [task] * rows
    return [text if text.endswith("\n") else f"{text}\n" for text in texts]


def language(policy: Any, texts: list[str], device: torch.device) -> dict[str, torch.Tensor]:
    """The tasks as SmolVLA's language inputs: its VLM's tokenizer, as LeRobot's TokenizerProcessorStep calls it."""
    config = policy.config
    tokens = policy.model.vlm_with_expert.processor.tokenizer(
        texts,
        max_length=config.tokenizer_max_length,
        truncation=True,
        padding=config.pad_language_to,
        padding_side="right",
        return_tensors="pt",
    )
    return {
        LANGUAGE_TOKENS: tokens["input_ids"].to(device),
        LANGUAGE_MASK: tokens["attention_mask"].to(device=device, dtype=torch.bool),
    }


def chunk_from_noise(policy: Any, batch: dict[str, torch.Tensor], noise: torch.Tensor, executed: int) -> torch.Tensor:
    """SmolVLA's Euler integration from `noise` (B, chunk_size, max_action_dim), normalised, cut to the
    first `executed` actions and the robot's action size (B, executed, A). Differentiable in `noise`."""
    images, masks = policy.prepare_images(batch)
    state = policy.prepare_state(batch)
    actions = policy.model.sample_actions(
        images, masks, batch[LANGUAGE_TOKENS], batch[LANGUAGE_MASK], state, noise=noise.float()
    )
    return actions[:, :executed, : policy.config.action_feature.shape[0]]
