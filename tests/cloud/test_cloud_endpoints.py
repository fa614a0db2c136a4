"""A learner bound to every interface tells edges an address they can dial, not 0.0.0.0 (which an
edge on a robot's controller would take for its own machine)."""

from __future__ import annotations

import ipaddress

import pytest

from user_rl.cloud.endpoints import reachable_endpoint, this_machine_address


@pytest.mark.parametrize("bound", ["tcp://0.0.0.0:5555", "tcp://*:5555"])
def test_a_wildcard_endpoint_is_told_as_this_machines_address(bound: str) -> None:
    told = reachable_endpoint(bound)
    host, port = told.removeprefix("tcp://").rsplit(":", 1)
    assert port == "5555" and host == this_machine_address()
    assert not ipaddress.ip_address(host).is_unspecified


@pytest.mark.parametrize("bound", ["tcp://127.0.0.1:5555", "tcp://10.0.0.5:6000", "ipc:///tmp/learner"])
def test_a_specific_endpoint_is_told_as_it_is(bound: str) -> None:
    assert reachable_endpoint(bound) == bound
