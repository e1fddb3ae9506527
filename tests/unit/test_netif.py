"""When the workers are told which interface the collectives should use (pure), and the interface lookup."""

from __future__ import annotations

import pytest

from rankrun.netif import collective_interface, interface_of, is_loopback

BOTH = {"GLOO_SOCKET_IFNAME": "veth0", "NCCL_SOCKET_IFNAME": "veth0"}


@pytest.mark.parametrize(
    ("base", "rendezvous", "hostname", "interface", "expected"),
    [
        ({}, "10.200.0.2", "127.0.0.1", "veth0", BOTH),  # the trap: the host's name says loopback, peers are elsewhere
        ({}, "10.200.0.2", "10.200.0.2", "veth0", {}),  # the name resolves to the real address: gloo finds it
        ({}, "127.0.0.1", "127.0.0.1", "lo", {}),  # everything on one machine: loopback is right
        ({"NCCL_SOCKET_IFNAME": "ib0"}, "10.200.0.2", "127.0.0.1", "veth0", {}),  # never over the user's choice
        ({"GLOO_SOCKET_IFNAME": "eth1"}, "10.200.0.2", "127.0.1.1", "veth0", {}),
        ({}, "10.200.0.2", "127.0.1.1", None, {}),  # no interface found: say nothing rather than guess
    ],
)
def test_collective_interface(base, rendezvous, hostname, interface, expected):
    assert collective_interface(base, rendezvous, hostname, interface) == expected


def test_interface_lookup_and_loopback():
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.77") is None  # TEST-NET-1: on no interface here
    assert is_loopback("127.3.4.5") and not is_loopback("10.0.0.1") and not is_loopback("not-an-address")
