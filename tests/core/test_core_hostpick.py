"""host = "auto" (peerd.core.hostpick): the default route's address, else the
only address besides loopback, else an error that lists what was found."""

from __future__ import annotations

import pytest

from peerd.core.hostpick import ONLY_REASON, ROUTE_REASON, ROUTE_SOURCE_REASON, HostPick, NoHostPick, pick_host

LO = ("lo", "127.0.0.1")
LO6 = ("lo", "::1")
ETH0 = ("eth0", "10.1.2.3")
WLAN0 = ("wlan0", "192.168.5.7")
DOCKER0 = ("docker0", "172.17.0.1")


def test_with_a_default_route_its_address_is_picked_and_named_after_its_interface():
    assert pick_host("10.1.2.3", [LO, ETH0, WLAN0]) == HostPick("10.1.2.3", "eth0", ROUTE_REASON)


def test_with_a_default_route_other_interfaces_do_not_matter():
    assert pick_host("192.168.5.7", [LO, ETH0, WLAN0, DOCKER0]).interface == "wlan0"


def test_the_route_address_is_picked_even_when_no_listed_interface_holds_it():
    assert pick_host("10.9.9.9", [LO]) == HostPick("10.9.9.9", "", ROUTE_SOURCE_REASON)


def test_the_pick_says_what_and_why_in_one_phrase():
    assert pick_host("10.1.2.3", [ETH0]).describe() == "10.1.2.3 (eth0, the default route's interface)"
    assert pick_host("10.9.9.9", []).describe() == "10.9.9.9 (the default route's source address)"


def test_without_a_default_route_the_only_address_besides_loopback_is_picked():
    assert pick_host(None, [LO, LO6, ETH0]) == HostPick("10.1.2.3", "eth0", ONLY_REASON)


def test_ipv6_and_link_local_addresses_do_not_count():
    pairs = [LO, ("eth0", "fe80::1"), ("eth0", "fd00::2"), ("eth1", "169.254.10.20"), WLAN0]
    assert pick_host(None, pairs).address == "192.168.5.7"


def test_an_address_listed_twice_counts_once():
    assert pick_host(None, [ETH0, ETH0]).address == "10.1.2.3"


def test_a_loopback_or_unspecified_route_address_counts_as_no_route():
    assert pick_host("127.0.0.1", [LO, ETH0]).reason == ONLY_REASON
    assert pick_host("0.0.0.0", [LO, ETH0]).reason == ONLY_REASON


def test_without_a_default_route_two_addresses_are_an_error_that_lists_both_and_says_what_to_set():
    with pytest.raises(NoHostPick) as info:
        pick_host(None, [LO, ETH0, DOCKER0])
    message = str(info.value)
    assert "no default route" in message
    assert "10.1.2.3 (eth0)" in message and "172.17.0.1 (docker0)" in message
    assert "set daemon.host (or PEERD_HOST) to one of them" in message


def test_two_addresses_on_one_interface_are_also_too_many():
    with pytest.raises(NoHostPick, match=r"2 IPv4 addresses"):
        pick_host(None, [ETH0, ("eth0", "10.1.2.4")])


def test_without_a_default_route_and_only_loopback_the_error_asks_for_the_lan_address():
    with pytest.raises(NoHostPick) as info:
        pick_host(None, [LO, LO6])
    assert "no IPv4 address besides loopback" in str(info.value)
    assert "set daemon.host (or PEERD_HOST) to this machine's LAN address" in str(info.value)


def test_an_error_names_the_link_local_addresses_it_passed_over():
    with pytest.raises(NoHostPick, match=r"link-local ones are never picked: 169\.254\.1\.2 \(eth0\)"):
        pick_host(None, [LO, ("eth0", "169.254.1.2")])
