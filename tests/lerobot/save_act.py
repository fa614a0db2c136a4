"""Save a small ACT policy the way a LeRobot user has one on disk: LeRobot's own config class and
`save_pretrained` (config.json, model.safetensors) with the pre/post-processors that hold its
normalisation stats. Nothing is downloaded (no ImageNet backbone: the policy reads no camera).

    python tests/lerobot/save_act.py OUT_DIR JOINTS CHUNK
"""

import sys

import numpy as np
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors

STATE_MEAN, STATE_STD = 5.0, 40.0  # degrees; what the test checks the edge's normalisation against
ACTION_MEAN, ACTION_STD = 0.0, 45.0


def save_act(out: str, joints: int, chunk: int) -> int:
    """Write the policy to `out`; return its parameter count."""
    vector = (joints,)
    config = ACTConfig(
        device="cpu",
        chunk_size=chunk,
        n_action_steps=chunk,
        pretrained_backbone_weights=None,
        input_features={
            "observation.state": PolicyFeature(FeatureType.STATE, vector),
            "observation.environment_state": PolicyFeature(FeatureType.ENV, vector),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, vector)},
        dim_model=32,
        n_heads=2,
        dim_feedforward=64,
        n_encoder_layers=1,
        n_decoder_layers=1,
        n_vae_encoder_layers=1,
        latent_dim=4,
    )
    return save_with_stats(
        ACTPolicy(config), config, vector, vector, STATE_MEAN, STATE_STD, ACTION_MEAN, ACTION_STD, out
    )


def save_with_stats(policy, config, state_shape, action_shape, state_mean, state_std, action_mean, action_std, out):
    """`policy` and the pre/post-processors normalising its state and action by these stats, saved to
    `out` as LeRobot saves them; its parameter count."""
    stats = {
        "observation.state": {"mean": np.full(state_shape, state_mean), "std": np.full(state_shape, state_std)},
        "action": {"mean": np.full(action_shape, action_mean), "std": np.full(action_shape, action_std)},
    }
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    for part in (policy, preprocessor, postprocessor):
        part.save_pretrained(out)
    return sum(p.numel() for p in policy.parameters())


if __name__ == "__main__":
    print(save_act(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
