"""Save a tiny SmolVLA the way a LeRobot user has one on disk: LeRobot's own config class and
`save_pretrained` (config.json, model.safetensors) with the pre/post-processors that hold its
normalisation stats and name its tokenizer, on a tiny SmolVLM written locally
(user_rl/policies/tiny_smolvlm.py). Nothing is downloaded.

    python tests/lerobot/save_smolvla.py OUT_DIR VLM_DIR STATE_DIM ACTION_DIM CHUNK [CAMERA_KEY [IMAGE_SIZE]]
"""

import sys

import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
from save_act import save_with_stats  # this script's directory is on the path

from user_rl.policies.tiny_smolvlm import tiny_smolvla_fields, write_tiny_smolvlm

STATE_MEAN, STATE_STD = 0.1, 2.0  # what the tests check the edge's normalisation against
ACTION_MEAN, ACTION_STD = 0.05, 0.5


def save_smolvla(
    out: str, vlm_dir: str, state_dim: int, action_dim: int, chunk: int, camera: str = "image", image_size: int = 32
) -> int:
    """Write the tiny VLM to `vlm_dir` and a SmolVLA on it (random weights, seed 0) to `out`; return
    its parameter count."""
    write_tiny_smolvlm(vlm_dir)
    torch.manual_seed(0)
    config = SmolVLAConfig(
        device="cpu",
        chunk_size=chunk,
        n_action_steps=chunk // 2,
        input_features={
            "observation.state": PolicyFeature(FeatureType.STATE, (state_dim,)),
            f"observation.images.{camera}": PolicyFeature(FeatureType.VISUAL, (3, image_size, image_size)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (action_dim,))},
        **tiny_smolvla_fields(vlm_dir),
    )
    return save_with_stats(
        SmolVLAPolicy(config), config, state_dim, action_dim, STATE_MEAN, STATE_STD, ACTION_MEAN, ACTION_STD, out
    )


if __name__ == "__main__":
    out, vlm, state, action, chunk, *rest = sys.argv[1:]
    camera = rest[0] if rest else "image"
    size = int(rest[1]) if len(rest) > 1 else 32
    print(save_smolvla(out, vlm, int(state), int(action), int(chunk), camera, size))
