"""A LeanRL-style SAC update: the reference a graph-captured learner is measured against on a GPU.

LeanRL (pytorch-labs/LeanRL) takes CleanRL's single-file SAC and makes it fast without changing what
it computes: the update function compiled with `torch.compile`, then captured as a CUDA graph over
static inputs (its replay buffer lives on the device, so a batch is already there), capturable Adam,
the two Q-networks as one vectorised pair, and Polyak averaging as one fused `lerp`. This is that
recipe, written here from its description: the same networks and losses as `PlainSAC` in
`bench/policy_updates.py` (CleanRL's shape), two Q-networks stacked with `torch.func`.

`bench/policy_updates.py --device cuda` times it beside this system's update, in the same process.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Normal

WARMUP = 3


def mlp(inputs: int, outputs: int, hidden: list[int], device: torch.device) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = inputs
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    return nn.Sequential(*layers, nn.Linear(width, outputs)).to(device)


class LeanSAC:
    """SAC's update compiled and replayed as one CUDA graph; `update(obs, action, reward, next_obs, terminated)`
    copies the batch (already on the device) into the graph's inputs and replays it."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int], device: torch.device, compile: bool = True):
        self.device = device
        self.graphable = device.type == "cuda"  # capturable Adam exists only there
        self.actor = mlp(obs_dim, 2 * action_dim, hidden, device)
        q_nets = [mlp(obs_dim + action_dim, 1, hidden, device) for _ in range(2)]
        self.q_params = {k: v.requires_grad_() for k, v in torch.func.stack_module_state(q_nets)[0].items()}
        self.q_target = {k: v.detach().clone() for k, v in self.q_params.items()}
        self.q_shape = copy.deepcopy(q_nets[0]).to("meta")
        self.log_alpha = torch.zeros(1, device=device, requires_grad=True)
        self.target_entropy = -float(action_dim)
        self.q_optim = torch.optim.Adam(list(self.q_params.values()), lr=3e-4, capturable=self.graphable)
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=3e-4, capturable=self.graphable)
        self.alpha_optim = torch.optim.Adam([self.log_alpha], lr=3e-4, capturable=self.graphable)
        self.step = torch.compile(self._step) if compile else self._step
        self.compiled = compile
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: tuple[torch.Tensor, ...] = ()
        self.output = torch.zeros((), device=device)
        self.calls = 0

    def q(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        """Both Q-networks on `x`: [2, B, 1]."""
        return torch.vmap(lambda p: torch.func.functional_call(self.q_shape, p, (x,)))(params)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.actor(obs).chunk(2, dim=-1)
        log_std = -5.0 + 3.5 * (torch.tanh(log_std) + 1.0)
        normal = Normal(mean, log_std.exp(), validate_args=False)
        x = normal.rsample()
        action = torch.tanh(x)
        return action, (normal.log_prob(x) - torch.log(1.0 - action.pow(2) + 1e-6)).sum(-1, keepdim=True)

    def _step(self, obs, action, reward, next_obs, terminated) -> torch.Tensor:
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_action, next_log_prob = self.sample(next_obs)
            next_q = self.q(self.q_target, torch.cat([next_obs, next_action], 1)).min(0).values
            target = reward.unsqueeze(1) + 0.99 * (1.0 - terminated.float().unsqueeze(1)) * (
                next_q - alpha * next_log_prob
            )
        q_loss = 2 * F.mse_loss(self.q(self.q_params, torch.cat([obs, action], 1)), target.expand(2, -1, -1))
        self.q_optim.zero_grad(set_to_none=True)
        q_loss.backward()
        self.q_optim.step()
        new_action, log_prob = self.sample(obs)
        q_new = self.q({k: v.detach() for k, v in self.q_params.items()}, torch.cat([obs, new_action], 1))
        actor_loss = (alpha * log_prob - q_new.min(0).values).mean()
        self.actor_optim.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optim.step()
        alpha_loss = (-self.log_alpha.exp() * (log_prob.detach() + self.target_entropy)).mean()
        self.alpha_optim.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_optim.step()
        with torch.no_grad():
            torch._foreach_lerp_(list(self.q_target.values()), list(self.q_params.values()), 0.005)
        return q_loss.detach()

    def update(self, *batch: torch.Tensor) -> torch.Tensor:
        if self.graph is None and self.calls < WARMUP:  # compile, and make Adam's state, on a side stream
            self.calls += 1
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                out = self.step(*batch)
            torch.cuda.current_stream(self.device).wait_stream(side)
            return out
        if self.graph is None:
            self.inputs = tuple(t.clone() for t in batch)
            torch.cuda.synchronize(self.device)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.output = self.step(*self.inputs)
        for static, tensor in zip(self.inputs, batch):
            static.copy_(tensor)
        self.graph.replay()
        return self.output
