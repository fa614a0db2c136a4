"""DrQ: soft actor-critic from pixels (Kostrikov et al., 2020; Yarats et al., 2021, DrQ-v2).

Three changes to `SAC`, and nothing else:
- one camera encoder, the critic's, shared by the actor: the actor's loss reads its features
  detached, so only the critic's loss shapes what the encoder sees (the published actor carries
  the encoder's weights, so an edge runs it as a plain actor);
- every batch's images (observation and next observation) are shifted at random by up to
  `augment_pad` pixels, a different shift per image, which regularises the critic's values;
- images stay uint8 until the encoder, on the learner's device (`ConvEncoder` scales them).
The target critic keeps its own encoder, updated by the same moving average as its heads.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from pydantic import Field

from user_rl.algos.augment import random_shift
from user_rl.algos.optim import adam
from user_rl.algos.sac import SAC, SACSettings
from user_rl.policies.encoders import is_image


class DrQSettings(SACSettings):
    """`algo.type: drq`: SAC from pixels."""

    needs_cameras = True

    type: str = "drq"
    augment_pad: int = Field(
        4, ge=0, le=32, description="images shift at random by up to this many pixels (DrQ's choice for 84 x 84)"
    )


class DrQ(SAC):
    name = "drq"
    Settings = DrQSettings

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        policy: str = "mlp",
        policy_options: dict | None = None,
        settings: DrQSettings | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.cameras = [k for k, space in obs_space.spaces.items() if is_image(space)]  # some: make_algo checks
        super().__init__(obs_space, action_space, policy, policy_options, settings or DrQSettings(), device)
        self.actor.encoder = self.critic.encoder
        own = [p for name, p in self.actor.named_parameters() if not name.startswith("encoder.")]
        self.actor_optim = adam(own, self.settings.actor_lr)

    def view(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        pad = self.settings.augment_pad
        return {k: random_shift(v, pad) if k in self.cameras else v for k, v in obs.items()}

    def actor_features(self, obs: dict[str, torch.Tensor], critic_features: torch.Tensor) -> torch.Tensor:
        return critic_features.detach()
