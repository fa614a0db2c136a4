"""A critic ensemble as one vectorised network: E Q-networks of one shape, their layers' weights
stacked along a leading member axis, so ten critics take as many kernel launches as two.

Each layer runs all members with one batched matmul (`torch.baddbmm` of the input broadcast to
[E, B, in] with weights [E, in, out] and biases [E, 1, out]). Chosen over `torch.func.vmap` of
`functional_call` by measuring both against E separate `nn.Sequential`s (what `TwinQCritic` was),
forward and backward, batch 256, hidden [256, 256], one CPU thread, three runs on a busy 2-core box
(`bench/critic_ensemble.py`): stacked 1.00-1.03x the separate networks' rate at E=2 and 0.88-0.98x
at E=10, vmap 0.78-0.85x and 0.71-0.85x; with LayerNorm, stacked 0.88-0.96x and 0.90-1.00x, vmap
0.63-0.67x and 0.69-0.73x. A whole SAC update on a CPU (same sizes) runs at 1.04x the rate it had
with separate networks (0.99x with LayerNorm), each measured as its ratio to the plain SAC loop of
`bench/policy_updates.py` in the same process. A CPU is bound by arithmetic, so there ten critics still cost about
four times two (`--critics 10`); a GPU running networks this small is bound by kernel launches,
which stacking makes as many for ten critics as for two. On a CPU (`compute_bound`) other forms
measured faster: the Q-value head and the LayerNorms take one of their own, and without gradients
(a target, a best-of-N pick) each member runs on its own with 2-D kernels on views of the stacked
weights, since there no backward pass has to gather the members' gradients: QC's best-of-8 target
(batch 1,024, hidden [256, 256], LayerNorm, one thread; `bench/critic_ensemble.py --no-grad`) at
0.92x the separate networks' rate where the stacked form ran at 0.81x (E=2), 0.98x against 0.68x (E=10).

Every member is built as `mlp(...)` builds one (nn.Linear's initialisation, LayerNorm before each
ReLU with `layer_norm`, the RLPD recipe) and then stacked, so a seed gives the same initial weights
as the separate networks did, and checkpoints written with separate networks (`q1.0.weight`, ...)
load (`stack_separate_members`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from user_rl.policies.encoders import DictEncoder, mlp


def compute_bound(x: torch.Tensor) -> bool:
    """Whether `x`'s device is bound by arithmetic (a CPU), where a few more, smaller kernels cost less than
    an extra pass over the activations, rather than by kernel launches (a GPU running small networks)."""
    return x.device.type == "cpu"


class StackedLinear(nn.Module):
    """E linear layers of one shape as one: out[e] = x[e] @ weight[e] + bias[e]."""

    def __init__(self, members: Sequence[nn.Linear]) -> None:
        super().__init__()
        self.weight = nn.Parameter(self.stack("weight", [m.weight.detach() for m in members]))  # [E, in, out]
        self.bias = nn.Parameter(self.stack("bias", [m.bias.detach() for m in members]))  # [E, 1, out]

    @staticmethod
    def stack(name: str, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """The members' `nn.Linear` tensors named `name` (or anything shaped as they are: Adam's moments)
        in this layer's layout: weights transposed to [in, out], biases as one row, along a member axis."""
        if name == "weight":
            return torch.stack([t.T for t in tensors]).contiguous()
        return torch.stack(list(tensors)).unsqueeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.shape[-1] == 1 and compute_bound(x):  # a Q-value head: its batched outer product
            return (x * self.weight.transpose(1, 2)).sum(-1, keepdim=True) + self.bias  # (backward) is slow there
        return torch.baddbmm(self.bias, x, self.weight)

    def member(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Member `index` alone on `x` [B, in]."""
        return torch.addmm(self.bias[index], x, self.weight[index])


class StackedLayerNorm(nn.Module):
    """E LayerNorms over the last axis, each member with its own scale and shift."""

    def __init__(self, members: Sequence[nn.LayerNorm]) -> None:
        super().__init__()
        self.shape, self.eps = members[0].normalized_shape, members[0].eps
        self.weight = nn.Parameter(self.stack("weight", [m.weight.detach() for m in members]))  # [E, 1, width]
        self.bias = nn.Parameter(self.stack("bias", [m.bias.detach() for m in members]))

    @staticmethod
    def stack(name: str, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.stack(list(tensors)).unsqueeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if compute_bound(x):  # each member's fused LayerNorm: no pass of its own for the scale and shift
            return torch.stack([self.member(index, member_x) for index, member_x in enumerate(x)])
        return torch.addcmul(self.bias, F.layer_norm(x, self.shape, eps=self.eps), self.weight)  # 2 kernels, any E

    def member(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Member `index` alone on `x` [B, width]."""
        return F.layer_norm(x, self.shape, self.weight[index, 0], self.bias[index, 0], self.eps)


def stack_mlps(members: Sequence[nn.Sequential]) -> nn.Sequential:
    """`mlp(...)` networks of one shape as one stacked network, layer i of it standing for layer i of each."""
    layers: list[nn.Module] = []
    for same_place in zip(*members):
        if isinstance(same_place[0], nn.Linear):
            layers.append(StackedLinear(same_place))
        elif isinstance(same_place[0], nn.LayerNorm):
            layers.append(StackedLayerNorm(same_place))
        else:
            layers.append(same_place[0])  # ReLU: nothing of its own
    return nn.Sequential(*layers)


# A Q-network's tensor before stacking: `q1.0.weight` (TwinQCritic's q1, q2) or `qs.3.2.bias` (a
# ModuleList of networks, as the example plugin's ensemble had): member, layer, tensor.
SEPARATE_KEY = re.compile(r"(?:q(?P<twin>\d+)|qs\.(?P<listed>\d+))\.(?P<layer>\d+)\.(?P<name>weight|bias)")


class QEnsemble(nn.Module):
    """`num_critics` Q-networks over one observation encoder, run as one stacked network.

    `q_of(features, action)` gives one tensor [E, B, 1]: `qs.min(0).values` is clipped double Q,
    `qs.mean(0)` the ensemble's mean, and iterating gives the members (`q1, q2 = critic.q_of(...)`).
    """

    def __init__(
        self,
        obs_space: gym.spaces.Dict,
        action_space: gym.spaces.Box,
        hidden: list[int],
        layer_norm: bool = False,
        num_critics: int = 2,
    ) -> None:
        super().__init__()
        if num_critics < 1:
            raise ValueError(f"a critic ensemble needs at least one Q-network, not num_critics={num_critics}")
        self.encoder = DictEncoder(obs_space)
        in_dim = self.encoder.out_dim + int(np.prod(action_space.shape))
        self.num_critics = num_critics
        self.qs = stack_mlps([mlp(in_dim, hidden, 1, layer_norm) for _ in range(num_critics)])
        self.register_load_state_dict_pre_hook(stack_separate_members)

    def forward(self, obs: dict[str, torch.Tensor], action: torch.Tensor) -> torch.Tensor:
        return self.q_of(self.encoder(obs), action)

    def q_of(self, features: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Every member's Q-values [E, B, 1] from encoded observations (one encoder pass serves several uses)."""
        x = torch.cat([features, action], dim=-1)
        if compute_bound(x) and not torch.is_grad_enabled():  # no backward to gather: each member on its own
            return torch.stack([self._member(index, x) for index in range(self.num_critics)])
        return self.qs(x.expand(self.num_critics, *x.shape))

    def _member(self, index: int, x: torch.Tensor) -> torch.Tensor:
        for layer in self.qs:
            x = layer.member(index, x) if isinstance(layer, (StackedLinear, StackedLayerNorm)) else layer(x)
        return x

    def stacked(self, name: str, member_tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """The members' tensors of stacked parameter `name` (`"0.weight"`, relative to `qs`) as that parameter."""
        layer, kind = name.split(".")
        return self.qs[int(layer)].stack(kind, member_tensors)

    def separate_layout(self) -> list[tuple[str, int]]:
        """(stacked parameter, member) of each parameter of the same ensemble as separate networks, in
        the order their `parameters()` came: every layer of the first member, then of the second, ..."""
        names = [name for name, _ in self.qs.named_parameters()]
        return [(name, member) for member in range(self.num_critics) for name in names]


def stack_separate_members(module: QEnsemble, state: dict, prefix: str, *_: object) -> None:
    """Load-time hook: a state dict written with separate Q-networks (`q1.0.weight`, `q2.0.weight`, ...)
    becomes the stacked layout in place; a member count other than this ensemble's is refused."""
    separate: dict[str, dict[int, torch.Tensor]] = {}
    for key in [k for k in state if k.startswith(prefix)]:
        found = SEPARATE_KEY.fullmatch(key[len(prefix) :])
        if found:
            member = int(found["twin"]) - 1 if found["twin"] else int(found["listed"])
            separate.setdefault(f"{found['layer']}.{found['name']}", {})[member] = state.pop(key)
    members = {m for tensors in separate.values() for m in tensors} or None
    stacked_first = state.get(prefix + "qs.0.weight")
    count = len(members) if members else None if stacked_first is None else stacked_first.shape[0]
    if count is not None and count != module.num_critics:
        raise ValueError(
            f"this checkpoint's critic has {count} Q-networks and this one {module.num_critics}: "
            f"set algo.num_critics: {count} to continue it"
        )
    for name, tensors in separate.items():
        state[f"{prefix}qs.{name}"] = module.stacked(name, [tensors[m] for m in range(module.num_critics)])


def to_stacked_layout(module: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of `state` (a state dict of `module`, or part of one) with the separate Q-networks of each
    critic ensemble in `module` stacked: what a file written before the ensembles were stacked needs
    before its names are compared with the module's."""
    state = dict(state)
    for name, sub in module.named_modules():
        if isinstance(sub, QEnsemble):
            stack_separate_members(sub, state, f"{name}." if name else "")
    return state
