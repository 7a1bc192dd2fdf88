"""The daemon's address book and its "heard of" state machine (peerd.core.directory)."""

from __future__ import annotations

from peerd.core.directory import HELLO, ZEROCONF, AddressChange, PeerDirectory


def test_own_id_is_never_learned():
    d = PeerDirectory("me")
    assert d.learn("me", "10.0.0.1:7000", ZEROCONF, 0.0) == AddressChange()
    assert "me" not in d


def test_a_new_address_replaces_the_old_and_frees_it():
    d = PeerDirectory("me")
    assert d.learn("a", "10.0.0.1:7000", ZEROCONF, 0.0) == AddressChange(found=True)
    assert d.learn("a", "10.0.0.1:7000", ZEROCONF, 1.0) == AddressChange()  # nothing new
    assert d.learn("a", "10.0.0.1:7001", ZEROCONF, 2.0) == AddressChange(found=True, unused="10.0.0.1:7000")
    assert d.address("a") == "10.0.0.1:7001"


def test_an_address_shared_by_two_peers_is_freed_only_with_the_last():
    d = PeerDirectory("me")
    d.learn("a", "10.0.0.1:7000", ZEROCONF, 0.0)
    d.learn("b", "10.0.0.1:7000", ZEROCONF, 0.0)
    assert d.forget("a") is None
    assert d.forget("b") == "10.0.0.1:7000"


def test_a_peer_only_heard_of_is_forgotten_when_silent_past_the_timeout():
    d = PeerDirectory("me")
    d.learn("a", "10.0.0.1:7000", HELLO, 0.0)
    assert d.expire(5.0, 6.0, answering=lambda p: False) == []  # not yet
    assert d.expire(7.0, 6.0, answering=lambda p: True) == []  # it answers
    assert d.expire(7.0, 6.0, answering=lambda p: False) == ["10.0.0.1:7000"]
    assert "a" not in d


def test_zeroconf_makes_a_heard_of_peer_permanent():
    d = PeerDirectory("me")
    d.learn("a", "10.0.0.1:7000", HELLO, 0.0)
    d.learn("a", "10.0.0.1:7000", ZEROCONF, 1.0)
    assert d.expire(100.0, 6.0, answering=lambda p: False) == []
    d.learn("a", "10.0.0.1:7000", HELLO, 2.0)  # hearing of it again does not make it "heard of"
    assert d.expire(100.0, 6.0, answering=lambda p: False) == [] and "a" in d
