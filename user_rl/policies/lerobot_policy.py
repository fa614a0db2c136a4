"""A LeRobot policy (ACT, diffusion or SmolVLA) as a chunk actor: the edge runs it, the learner fine-tunes it.

    policy:
      type: lerobot
      chunk: 20                  # the actions a training row imitates: chunk_size (diffusion: horizon)
      lerobot: {type: act, n_action_steps: 10, dim_model: 256}    # LeRobot's own config fields
      # or, local weights: lerobot: {path: /models/act_pick}   # a directory LeRobot's save_pretrained wrote

Built from LeRobot's own config classes (`--policy.type=act` / `--policy.path=DIR` in LeRobot's CLI),
with nothing downloaded: ACT's ImageNet backbone weights default to none here. The edge executes
`n_action_steps` actions per inference (default: the whole chunk) through `ChunkRunner`; the learner
trains it with `algo.type: bc` through LeRobot's own loss (`policy.forward`).

Features. Camera keys (uint8 HxWxC) become `observation.images.<key>`; every other vector (an
instruction's bytes aside: neither ACT nor diffusion reads text) is concatenated, in key order, into
`observation.state`, the name LeRobot's robots and our dataset export use for a robot's state.
ACT and diffusion need an image or an environment state: a robot without a camera feeds its state
as `observation.environment_state` too. SmolVLA also reads the task (the `instruction`, else
`policy.task`) through its VLM's tokenizer (lerobot_smolvla.py).

Normalisation. LeRobot 0.4 normalises in processor pipelines beside the model; here it is one affine
map per feature, kept as buffers, so it travels with the weights to every edge and into checkpoints.
With `path`, the map is the directory's own (its preprocessor's stats and modes); otherwise every
bounded feature's bounds map to [-1, 1] (actions, pixels in [0, 1], a bounded state) and an unbounded
state passes unchanged. A feature LeRobot leaves unnormalised (mode IDENTITY: SmolVLA's images) stays so.

A LeRobot loss takes a padding mask, not weights: an action of the chunk with any imitation weight
counts fully, one with none (not executed in its episode, or the policy's own) not at all.
"""

from __future__ import annotations

import importlib
import logging
import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from pydantic import Field, field_validator, model_validator
from torch import nn

from user_rl.config_plugins import PolicySettings
from user_rl.extras import LEROBOT_ENV_COMMAND, LEROBOT_MISSING
from user_rl.policies import lerobot_smolvla as smolvla
from user_rl.policies.encoders import is_image, unit_pixels

log = logging.getLogger(__name__)

KINDS = ("act", "diffusion", "smolvla")
STATE, ENV_STATE, ACTION, IMAGES = "observation.state", "observation.environment_state", "action", "observation.images"


def _lerobot() -> Any:
    """LeRobot's policy configs registered (importing the package registers them)."""
    try:
        importlib.import_module("lerobot.policies")  # registers act, diffusion, ... with their config base
        from lerobot.configs.policies import PreTrainedConfig
    except ImportError as exc:
        raise RuntimeError(f"policy.type lerobot needs LeRobot: {LEROBOT_MISSING} (import failed: {exc})") from None
    return PreTrainedConfig


def lerobot_keys(obs_space: gym.spaces.Dict) -> tuple[list[str], list[str]]:
    """(cameras, state keys): the observations LeRobot sees as `observation.images.<key>`, and those
    it sees concatenated, in this order, as `observation.state` (uint8 vectors, such as an
    instruction's bytes, are neither). What policies run and what a dataset export writes."""
    keys = sorted(obs_space.spaces)
    cameras = [k for k in keys if is_image(obs_space[k])]
    return cameras, [k for k in keys if k not in cameras and obs_space[k].dtype != np.uint8]


class PolicyInputs:
    """Which observation keys feed which LeRobot feature, and the features' shapes."""

    def __init__(self, obs_space: gym.spaces.Dict, action_space: gym.spaces.Box) -> None:
        keys = sorted(obs_space.spaces)
        self.cameras, self.state_keys = lerobot_keys(obs_space)
        if not self.state_keys:
            raise ValueError(
                f"a LeRobot policy needs a state vector among the observations; this robot has only {', '.join(keys)}"
            )
        self.state_dim = sum(int(np.prod(obs_space[k].shape)) for k in self.state_keys)
        self.env_state = not self.cameras  # the state doubles as the environment state
        self.action_dim = int(action_space.shape[0])
        self.obs_space, self.action_space = obs_space, action_space

    def features(self) -> tuple[dict[str, tuple[str, tuple[int, ...]]], dict[str, tuple[str, tuple[int, ...]]]]:
        """(inputs, outputs) as {name: (LeRobot feature type, shape)}; images are (C, H, W)."""
        inputs = {STATE: ("STATE", (self.state_dim,))}
        if self.env_state:
            inputs[ENV_STATE] = ("ENV", (self.state_dim,))
        for key in self.cameras:
            h, w, c = self.obs_space[key].shape
            inputs[f"{IMAGES}.{key}"] = ("VISUAL", (c, h, w))
        return inputs, {ACTION: ("ACTION", (self.action_dim,))}

    def bounds(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """(low, high) of every feature whose observations are bounded, as the features see them."""
        found = {ACTION: (self.action_space.low, self.action_space.high)}
        low = np.concatenate([np.ravel(self.obs_space[k].low) for k in self.state_keys]).astype(np.float64)
        high = np.concatenate([np.ravel(self.obs_space[k].high) for k in self.state_keys]).astype(np.float64)
        if np.isfinite(low).all() and np.isfinite(high).all():
            found[STATE] = found[ENV_STATE] = (low, high)
        for key in self.cameras:
            channels = self.obs_space[key].shape[-1]
            found[f"{IMAGES}.{key}"] = (np.zeros((channels, 1, 1)), np.ones((channels, 1, 1)))
        return found


def build_config(kind: str, chunk: int, inputs: PolicyInputs, fields: dict[str, Any]) -> Any:
    """A fresh ACT / diffusion / SmolVLA config for these spaces, `fields` as LeRobot's CLI would set them."""
    from lerobot.configs.types import FeatureType, PolicyFeature

    if kind not in KINDS:
        raise ValueError(
            f"policy.lerobot.type: {kind!r} is not supported; one of {', '.join(KINDS)} "
            f"(or path: a directory LeRobot's save_pretrained wrote)"
        )
    taken = {"input_features", "output_features", "chunk_size", "horizon"} & set(fields)
    if taken:
        raise ValueError(
            f"policy.lerobot.{sorted(taken)[0]} is set by user-rl: features come from the robot's "
            "spaces, the chunk from policy.chunk"
        )
    ins, outs = inputs.features()
    defaults: dict[str, Any] = {
        "device": "cpu",
        "n_action_steps": chunk,
        "input_features": {n: PolicyFeature(FeatureType[t], s) for n, (t, s) in ins.items()},
        "output_features": {n: PolicyFeature(FeatureType[t], s) for n, (t, s) in outs.items()},
    }
    if kind == "act":
        defaults.update(chunk_size=chunk, pretrained_backbone_weights=None)  # never download ImageNet weights
    elif kind == "smolvla":
        defaults.update(chunk_size=chunk)
    else:
        if fields.get("n_obs_steps", 1) != 1:
            raise ValueError("policy.lerobot.n_obs_steps: the edge gives the policy one observation a step (1)")
        defaults.update(horizon=chunk, n_obs_steps=1)
    try:
        config = _lerobot().get_choice_class(kind)(**{**defaults, **fields})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"policy.lerobot ({kind}): {exc}") from None
    if kind == "smolvla":
        smolvla.check(config, inputs.cameras, inputs.state_dim, inputs.action_dim)
    return config


def load_config(path: Path, chunk: int, inputs: PolicyInputs, overrides: dict[str, Any]) -> tuple[Any, bool]:
    """A saved policy's config, checked against these spaces and `policy.chunk`, and whether its
    features are the robot's (a SmolVLA's need not be: it pads the state and actions, and its VLM
    reads any camera, so a base trained on other robots takes this robot's features)."""
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"policy.lerobot.path: {path} holds no config.json (a directory LeRobot's "
            "save_pretrained wrote is expected)"
        )
    config = _lerobot().from_pretrained(str(path))
    if config.type not in KINDS:
        raise ValueError(f"policy.lerobot.path: {path} holds a {config.type!r} policy; supported: {', '.join(KINDS)}")
    planned = config.horizon if config.type == "diffusion" else config.chunk_size
    if planned != chunk:
        raise ValueError(
            f"policy.chunk: the {config.type} policy at {path} plans {planned} actions a chunk; "
            f"set policy.chunk: {planned}"
        )
    if config.type == "diffusion" and config.n_obs_steps != 1:
        raise ValueError(
            f"policy.lerobot.path: the diffusion policy at {path} reads {config.n_obs_steps} "
            "observations; the edge gives it one (n_obs_steps 1)"
        )
    ins, outs = inputs.features()
    saved = {n: (f.type.name, tuple(f.shape)) for n, f in {**config.input_features, **config.output_features}.items()}
    ours = {**ins, **outs}
    if saved != ours and config.type == "smolvla":
        log.warning(
            "the SmolVLA at %s reads %s; it takes this robot's %s, normalised by the robot's bounds", path, saved, ours
        )
        from lerobot.configs.types import FeatureType, PolicyFeature

        config.input_features = {n: PolicyFeature(FeatureType[t], s) for n, (t, s) in ins.items()}
        config.output_features = {n: PolicyFeature(FeatureType[t], s) for n, (t, s) in outs.items()}
    elif saved != ours:
        differ = sorted(set(saved) ^ set(ours)) or sorted(n for n in saved if saved[n] != ours[n])
        raise ValueError(
            f"policy.lerobot.path: the policy at {path} reads {saved}, this robot gives {ours} "
            f"(first difference: {differ[0]})"
        )
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise ValueError(f"policy.lerobot.{key}: the {config.type} config has no such field")
        setattr(config, key, value)
    if not 1 <= config.n_action_steps <= chunk:
        raise ValueError(f"policy.lerobot.n_action_steps: {config.n_action_steps} actions of a {chunk}-action chunk")
    if config.type == "smolvla":
        smolvla.check(config, inputs.cameras, inputs.state_dim, inputs.action_dim)
    return config, saved == ours


def saved_normalisation(path: Path, config: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
    """(shift, scale) per normalised feature from the directory's preprocessor (LeRobot: (x - shift) /
    scale; a feature it leaves out passes unchanged), or None if the directory has no preprocessor."""
    if not (path / "policy_preprocessor.json").is_file():
        log.warning("%s has no policy_preprocessor.json: normalising by the robot's bounds instead", path)
        return None
    from lerobot.configs.types import NormalizationMode as Mode
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.processor import NormalizerProcessorStep

    # SmolVLA's tokenizer step names the Hub VLM it was saved with: load it from vlm_model_name instead
    overrides = {"tokenizer_processor": {"tokenizer_name": config.vlm_model_name}} if config.type == "smolvla" else {}
    pre, _ = make_pre_post_processors(config, pretrained_path=str(path), preprocessor_overrides=overrides)
    step = next((s for s in pre.steps if isinstance(s, NormalizerProcessorStep)), None)
    if step is None:
        return {}
    pairs = {Mode.MIN_MAX: ("min", "max"), Mode.QUANTILES: ("q01", "q99"), Mode.QUANTILE10: ("q10", "q90")}
    found = {}
    for name, feature in step.features.items():
        mode, stats = step.norm_map.get(feature.type, Mode.IDENTITY), step.stats.get(name)
        if mode == Mode.IDENTITY or not stats:
            continue
        as_tensor = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in stats.items()}
        if mode == Mode.MEAN_STD:
            found[name] = (as_tensor["mean"], as_tensor["std"] + step.eps)
        else:
            low, high = (as_tensor[k] for k in pairs[mode])
            span = torch.where(high == low, torch.full_like(high, step.eps), high - low)
            found[name] = (low + span / 2, span / 2)
    return found


class LeRobotSettings(PolicySettings):
    """`policy.type: lerobot`: a LeRobot ACT, diffusion or SmolVLA policy (trained by bc); its sizes
    are fields of `lerobot`, so it has no `hidden`."""

    chunked = True
    steerable_by_noise = True  # SmolVLA, and diffusion with a DDIM sampler (the actor says so when it is neither)

    type: str = "lerobot"
    chunk: int = Field(1, ge=1, le=128, description="ACT's and SmolVLA's chunk_size, diffusion's horizon")
    lerobot: dict[str, Any] | None = Field(
        None,
        description="{type: act|diffusion|smolvla, <its config fields>} or "
        "{path: <a directory LeRobot's save_pretrained wrote>}",
    )
    task: str = Field("", description="SmolVLA: the task it is told when the robot gives no `instruction` observation")

    @field_validator("lerobot")
    @classmethod
    def _absolute_lerobot_path(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """The learner may run in another working directory (a Ray worker)."""
        if value is None or "path" not in value:
            return value
        return {**value, "path": str(Path(value["path"]).expanduser().resolve())}

    @model_validator(mode="after")
    def _type_or_path(self) -> LeRobotSettings:
        if not self.lerobot or ("type" in self.lerobot) == ("path" in self.lerobot):
            raise ValueError(
                "policy.lerobot: give its type (act, diffusion or smolvla, with LeRobot's config fields) or "
                "path (a directory LeRobot's save_pretrained wrote)"
            )
        return self

    @property
    def actions_per_chunk(self) -> int:
        return self.chunk


class LeRobotChunkActor(nn.Module):
    """A LeRobot ACT, diffusion or SmolVLA policy behind the chunk actor interface (`act_chunk`, `imitation_loss`)."""

    Settings = LeRobotSettings

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        chunk: int,
        lerobot: dict[str, Any],
        task: str = "",
    ) -> None:
        super().__init__()
        _lerobot()  # first: without the package nothing else can be checked
        fields = dict(lerobot)
        path = fields.pop("path", None)
        kind = fields.pop("type", None)
        if (path is None) == (kind is None):
            raise ValueError(
                "policy.lerobot: give its type (act, diffusion or smolvla, with LeRobot's config fields) or "
                "path (a directory LeRobot's save_pretrained wrote), one of the two"
            )
        self.inputs = PolicyInputs(obs_space, action_space)
        if path is not None:
            path = Path(path)
            config, own_features = load_config(path, chunk, self.inputs, fields)
            self.policy = _policy_class(config.type).from_pretrained(str(path), config=config, strict=True)
            normalisation = saved_normalisation(path, config) if own_features else None
        else:
            config = build_config(kind, chunk, self.inputs, fields)
            self.policy = _policy_class(config.type)(config)
            normalisation = None
        self.config = config
        self.task = task  # SmolVLA's task when the robot gives no instruction
        self.pretrained = path is not None  # the edge acts with these weights until the learner's first version
        self.kind = config.type
        self.chunk_length = int(config.n_action_steps)  # what the edge executes per inference
        self._register_normalisation(self._from_bounds() if normalisation is None else normalisation)
        low, high = (torch.as_tensor(b, dtype=torch.float32) for b in (action_space.low, action_space.high))
        self.register_buffer("action_low", low)
        self.register_buffer("action_high", high)

    # -- normalisation ---------------------------------------------------------------------------------
    def _from_bounds(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        ins, outs = self.inputs.features()
        kinds = {name: kind for name, (kind, _) in {**ins, **outs}.items()}
        found = {}
        for name, (low, high) in self.inputs.bounds().items():
            mode = self.config.normalization_mapping.get(kinds.get(name))  # None: not a feature of this policy
            if getattr(mode, "value", mode) == "IDENTITY":  # LeRobot leaves it as it is (SmolVLA's images)
                continue
            low, high = torch.as_tensor(low, dtype=torch.float32), torch.as_tensor(high, dtype=torch.float32)
            found[name] = ((high + low) / 2, ((high - low) / 2).clamp(min=1e-8))
        return found

    def _register_normalisation(self, found: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """One (shift, scale) buffer pair per feature; identity where none is known."""
        ins, outs = self.inputs.features()
        for name in {**ins, **outs}:
            shift, scale = found.get(name, (torch.zeros(()), torch.ones(())))
            self.register_buffer(_buffer(name, "shift"), shift.float().clone())
            self.register_buffer(_buffer(name, "scale"), scale.float().clone())

    def _normalised(self, name: str, value: torch.Tensor) -> torch.Tensor:
        return (value - getattr(self, _buffer(name, "shift"))) / getattr(self, _buffer(name, "scale"))

    def normalize(self, action: torch.Tensor) -> torch.Tensor:
        """Robot units → the policy's action units (the learner's targets)."""
        return self._normalised(ACTION, action)

    def to_robot_units(self, normalised: torch.Tensor) -> torch.Tensor:
        """The policy's actions in robot units, within the robot's bounds (ACT's regression is unbounded)."""
        action = normalised * getattr(self, _buffer(ACTION, "scale")) + getattr(self, _buffer(ACTION, "shift"))
        return torch.maximum(torch.minimum(action, self.action_high), self.action_low)

    def lerobot_batch(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Our observations (B, ...) as the policy's normalised inputs."""
        state = torch.cat([obs[k].flatten(1).float() for k in self.inputs.state_keys], dim=-1)
        batch = {STATE: self._normalised(STATE, state)}
        if self.inputs.env_state:
            batch[ENV_STATE] = self._normalised(ENV_STATE, state)
        for key in self.inputs.cameras:
            name = f"{IMAGES}.{key}"
            batch[name] = self._normalised(name, unit_pixels(obs[key]))
        if self.kind == "diffusion":  # one observation step: (B, 1, ...)
            batch = {name: value.unsqueeze(1) for name, value in batch.items()}
        elif self.kind == "smolvla":  # and the task, as tokens
            texts = smolvla.task_texts(obs, self.task, len(state))
            batch.update(smolvla.language(self.policy, texts, state.device))
        return batch

    # -- what DSRL steers ---------------------------------------------------------------------------
    @property
    def noise_shape(self) -> tuple[int, int]:
        """The noise the policy denoises a chunk from: a row per action of its whole plan (diffusion's
        horizon: the U-Net sees every position, so later positions shape the executed ones too; SmolVLA's
        chunk_size, each row padded to max_action_dim, as its action expert denoises them)."""
        self._check_steerable()
        if self.kind == "smolvla":
            return int(self.config.chunk_size), int(self.config.max_action_dim)
        return int(self.config.horizon), self.inputs.action_dim

    def chunk_from_noise(self, obs: dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        """The executed chunk (B, H, A), in the policy's normalised units, denoised from `noise`
        (B, rows * width of `noise_shape`) by a sampler that adds no noise of its own (DDIM, SmolVLA's
        Euler steps): the noise names the chunk."""
        rows, width = self.noise_shape
        batch = self._sampling_batch(obs)
        if self.kind == "smolvla":
            return smolvla.chunk_from_noise(
                self.policy, batch, noise.reshape(len(noise), rows, width), self.chunk_length
            )
        dtype = next(self.policy.diffusion.parameters()).dtype
        shaped = noise.reshape(len(noise), rows, width).to(dtype)
        return self.policy.diffusion.generate_actions(batch, noise=shaped).float()

    def _check_steerable(self) -> None:
        if self.kind == "smolvla" or (self.kind == "diffusion" and self.config.noise_scheduler_type == "DDIM"):
            return
        raise ValueError(
            f"algo.type dsrl steers a policy through the noise it denoises from, which must decide its chunk: "
            f"SmolVLA, or LeRobot's diffusion policy with noise_scheduler_type DDIM (this one is {self.kind}"
            + (f" with {self.config.noise_scheduler_type}" if self.kind == "diffusion" else "")
            + "); use algo.type residual for any chunk policy"
        )

    def _sampling_batch(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batch = self.lerobot_batch(obs)
        self.policy.eval()
        if self.kind == "diffusion" and self.inputs.cameras:
            batch[IMAGES] = torch.stack([batch[f"{IMAGES}.{k}"] for k in self.inputs.cameras], dim=-4)
        return batch

    # -- what edges run --------------------------------------------------------------------------------
    @torch.no_grad()
    def act_chunk(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        """The next `n_action_steps` actions in the robot's units, (B, H, A). ACT is deterministic at
        inference; diffusion and SmolVLA sample, from a fixed seed when `deterministic`."""
        if self.kind == "act":
            self.policy.eval()
            normalised = self.policy.predict_action_chunk(self.lerobot_batch(obs))[:, : self.chunk_length]
        elif self.kind == "smolvla":
            rows = len(next(iter(obs.values())))
            device = self.action_low.device
            seeded = torch.Generator(device=device).manual_seed(0) if deterministic else None
            noise = torch.randn(rows, math.prod(self.noise_shape), generator=seeded, device=device)
            normalised = self.chunk_from_noise(obs, noise)
        else:
            batch = self._sampling_batch(obs)
            if deterministic:  # the same chunk for the same observation: its sampler's noise from a fixed seed
                device = batch[STATE].device
                with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                    torch.manual_seed(0)
                    normalised = self.policy.diffusion.generate_actions(batch)
            else:
                normalised = self.policy.diffusion.generate_actions(batch)
        return self.to_robot_units(normalised)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        return self.act_chunk(obs, deterministic)[:, 0]

    # -- what the learner trains -------------------------------------------------------------------
    def imitation_loss(
        self, obs: dict[str, torch.Tensor], chunks: torch.Tensor, weights: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """LeRobot's own loss on normalised chunks (B, H, A); actions of weight 0 are padding."""
        self.policy.train()
        batch = {**self.lerobot_batch(obs), ACTION: chunks, "action_is_pad": weights <= 0}
        if self.kind == "smolvla":  # LeRobot 0.4.4's SmolVLA reads its padding mask under this name
            batch["actions_id_pad"] = batch["action_is_pad"]
        loss, parts = self.policy.forward(batch)
        return loss, {name: torch.as_tensor(float(value)) for name, value in (parts or {}).items()}


def _policy_class(kind: str) -> type:
    """LeRobot's policy class; SmolVLA's imports transformers (the smolvla extra)."""
    from lerobot.policies.factory import get_policy_class

    try:
        return get_policy_class(kind)
    except ImportError as exc:
        raise RuntimeError(
            f"LeRobot's {kind} policy needs what the smolvla extra installs (transformers, ...): "
            f"{LEROBOT_ENV_COMMAND} brings it (import failed: {exc})"
        ) from None


def _buffer(feature: str, what: str) -> str:
    """A buffer's name for a feature (buffer names cannot hold dots)."""
    return f"{feature.replace('.', '_')}_{what}"
