"""A critic ensemble run as one stacked network computes what its members would as separate networks
(values and gradients, LayerNorm members included), starts from the same weights a seed gave the
separate networks, and loads state dicts written with separate networks."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from user_rl.policies import TwinQCritic, ensemble
from user_rl.policies.encoders import mlp
from user_rl.policies.ensemble import QEnsemble, stack_mlps
from user_rl.policies.weights import load_weights

OBS = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (5,), np.float32)})
ACTION = gym.spaces.Box(-1, 1, (2,), np.float32)


def members(count: int, layer_norm: bool) -> list[nn.Sequential]:
    """`count` separate Q-networks with every parameter drawn at random (LayerNorm scales included)."""
    nets = [mlp(7, [16, 8], 1, layer_norm) for _ in range(count)]
    with torch.no_grad():
        for p in (p for net in nets for p in net.parameters()):
            p.copy_(torch.randn_like(p))
    return nets


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("cpu_form", [True, False], ids=["cpu-form", "gpu-form"])
def test_the_stacked_network_gives_its_members_values_and_gradients(
    layer_norm: bool, cpu_form: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both forms: the one a CPU runs (per-member LayerNorms, the head as a product) and the GPU's."""
    monkeypatch.setattr(ensemble, "compute_bound", lambda x: cpu_form)
    torch.manual_seed(0)
    separate = members(3, layer_norm)
    stacked = stack_mlps(separate)
    x = torch.randn(32, 7, requires_grad=True)
    x_stacked = x.detach().clone().requires_grad_(True)
    values = torch.stack([net(x) for net in separate])
    values_stacked = stacked(x_stacked.expand(3, *x.shape))
    assert values_stacked.shape == (3, 32, 1)
    torch.testing.assert_close(values_stacked, values, rtol=1e-5, atol=1e-5)

    weight = torch.tensor([1.0, -2.0, 0.5]).view(3, 1, 1)  # a different loss per member: no gradient mixes them
    (weight * values.pow(2)).sum().backward()
    (weight * values_stacked.pow(2)).sum().backward()
    torch.testing.assert_close(x_stacked.grad, x.grad, rtol=1e-4, atol=1e-4)  # what the actor's loss climbs
    for name, parameter in stacked.named_parameters():
        layer, kind = name.split(".")
        module = stacked[int(layer)]
        expected = module.stack(kind, [getattr(net[int(layer)], kind).grad for net in separate])
        torch.testing.assert_close(parameter.grad, expected, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_without_gradients_a_cpu_runs_each_member_alone_and_gets_the_same_values(layer_norm: bool) -> None:
    """A target or a best-of-N pick (no gradients, on a CPU) runs member by member on views of the
    stacked weights: the same Q-values as with gradients, and as the separate networks."""
    torch.manual_seed(0)
    critic = QEnsemble(OBS, ACTION, hidden=[16, 8], layer_norm=layer_norm, num_critics=3)
    with torch.no_grad():
        for p in critic.parameters():
            p.copy_(torch.randn_like(p))
    obs = {"state": torch.randn(64, 5)}
    action = torch.randn(64, 2)
    with torch.no_grad():
        alone = critic(obs, action)
    stacked = critic(obs, action)
    assert stacked.requires_grad and not alone.requires_grad  # the two forms ran
    torch.testing.assert_close(alone, stacked.detach(), rtol=1e-5, atol=1e-5)
    assert alone.shape == (3, 64, 1)


def test_each_member_has_its_own_layer_norm_scale_and_shift() -> None:
    torch.manual_seed(0)
    separate = members(2, layer_norm=True)
    stacked = stack_mlps(separate)
    assert stacked[1].weight.shape == stacked[1].bias.shape == (2, 1, 16)
    x = torch.randn(4, 7).expand(2, 4, 7)
    before = stacked(x).detach()
    with torch.no_grad():
        stacked[1].weight[1].mul_(3.0)  # the second member's first LayerNorm only
    after = stacked(x).detach()
    assert torch.equal(after[0], before[0]) and not torch.allclose(after[1], before[1])


def test_a_seed_gives_the_ensemble_the_weights_it_gave_separate_networks() -> None:
    """Each member starts as nn.Linear starts (and as TwinQCritic's q1, q2 did): learning is unchanged."""
    torch.manual_seed(7)
    separate = [mlp(7, [16, 16], 1, True) for _ in range(2)]
    torch.manual_seed(7)
    critic = TwinQCritic(OBS, ACTION, [16, 16], layer_norm=True)
    assert isinstance(critic, QEnsemble) and critic.num_critics == 2
    for name, parameter in critic.qs.named_parameters():
        layer, kind = name.split(".")
        expected = critic.stacked(name, [getattr(net[int(layer)], kind).detach() for net in separate])
        assert torch.equal(parameter, expected), name


def test_q_of_gives_one_tensor_that_unpacks_into_its_members() -> None:
    critic = QEnsemble(OBS, ACTION, [16], num_critics=5)
    obs, action = {"state": torch.rand(6, 5)}, torch.rand(6, 2)
    qs = critic(obs, action)
    assert qs.shape == (5, 6, 1)
    first, *rest = critic.q_of(critic.encoder(obs), action)
    assert torch.equal(first, qs[0]) and len(rest) == 4
    q1, q2 = TwinQCritic(OBS, ACTION, [16])(obs, action)  # what qc, flow_ql, dsrl and residual unpack
    assert q1.shape == q2.shape == (6, 1)


class SeparateTwinQCritic(nn.Module):
    """TwinQCritic as it was before the ensemble was stacked: the layout of older checkpoints."""

    def __init__(self, hidden: list[int], layer_norm: bool) -> None:
        super().__init__()
        in_dim = 5 + 2
        self.q1 = mlp(in_dim, hidden, 1, layer_norm)
        self.q2 = mlp(in_dim, hidden, 1, layer_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.q1(x), self.q2(x)])


@pytest.mark.parametrize("layer_norm", [False, True])
def test_a_state_dict_of_separate_networks_loads(layer_norm: bool, tmp_path) -> None:
    torch.manual_seed(0)
    old = SeparateTwinQCritic([16, 16], layer_norm)
    with torch.no_grad():
        for p in old.parameters():
            p.copy_(torch.randn_like(p))
    state = old.state_dict()
    assert "q2.4.bias" in state and ("q1.1.weight" in state) == layer_norm  # Linear, LayerNorm, ReLU, ...
    critic = TwinQCritic(OBS, ACTION, [16, 16], layer_norm=layer_norm)
    critic.load_state_dict(state)
    obs, action = {"state": torch.rand(9, 5)}, torch.rand(9, 2)
    torch.testing.assert_close(critic(obs, action), old(torch.cat([obs["state"], action], -1)))

    # the same from a weights file holding an actor with such a critic in it (qc's flow carries one)
    holder, older = nn.Module(), nn.Module()
    holder.value, older.value = TwinQCritic(OBS, ACTION, [16, 16], layer_norm=layer_norm), old
    torch.save({"actor": older.state_dict()}, tmp_path / "checkpoint.pt")
    assert load_weights(holder, tmp_path / "checkpoint.pt") == []
    torch.testing.assert_close(holder.value(obs, action), critic(obs, action))


def test_a_state_dict_with_another_number_of_critics_is_refused_clearly() -> None:
    two = TwinQCritic(OBS, ACTION, [16]).state_dict()
    with pytest.raises(ValueError, match=r"critic has 2 Q-networks and this one 10: set algo.num_critics: 2"):
        QEnsemble(OBS, ACTION, [16], num_critics=10).load_state_dict(two)
    old = SeparateTwinQCritic([16], False).state_dict()
    with pytest.raises(ValueError, match=r"critic has 2 Q-networks and this one 3: set algo.num_critics: 2"):
        QEnsemble(OBS, ACTION, [16], num_critics=3).load_state_dict(old)
