"""Peer ids and host:port addresses: one rule each (peerd.core.names)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerd.settings.config import DaemonConfig, parse_config
from peerd.core.names import host_of, join_host_port, peer_id_from_hostname, split_host_port, valid_address, valid_peer_id
from peerd.daemon import app

@pytest.mark.parametrize("hostname, want", [
    ("lab-box-7", "lab-box-7-abc123"),
    ("lab.example.org", "lab-example-org-abc123"),
    ("bücher", "xn--bcher-kva-abc123"),  # IDNA: what DNS itself calls it
    ("δοκιμή.lab", "xn--jxalpdlp-lab-abc123"),
    ("", "peer-abc123"),
    ("---", "peer-abc123"),
    ("a" * 100, "a" * 40 + "-abc123"),
])
def test_a_peer_id_made_from_the_hostname_is_ascii(hostname, want):
    assert peer_id_from_hostname(hostname, "abc123") == want

@given(st.text(max_size=80))
def test_every_hostname_gives_a_peer_id_that_config_and_hello_accept(hostname):
    peer_id = peer_id_from_hostname(hostname, "abc123")
    assert valid_peer_id(peer_id)
    assert parse_config({"daemon": {"peer_id": peer_id}}, "test").peer_id == peer_id

def test_a_non_ascii_peer_id_is_refused_by_config_and_hello_alike():
    assert not valid_peer_id("bücher")
    assert not valid_peer_id("١٢٣")  # Arabic-Indic digits: isalnum(), not ASCII

def test_the_daemon_names_itself_in_ascii_on_a_non_ascii_host(tmp_path, monkeypatch):
    monkeypatch.setattr(app.socket, "gethostname", lambda: "bücher")
    config = DaemonConfig(state_dir=tmp_path)
    peer_id = app.load_peer_id(config)
    assert peer_id.startswith("xn--bcher-kva-") and valid_peer_id(peer_id)
    assert app.load_peer_id(config) == peer_id  # kept
    (tmp_path / "peer_id").write_text("bücher-123456\n")  # made by an older peerd
    remade = app.load_peer_id(config)
    assert valid_peer_id(remade) and (tmp_path / "peer_id").read_text().strip() == remade

@pytest.mark.parametrize("host, port, text", [
    ("127.0.0.1", 7000, "127.0.0.1:7000"),
    ("::1", 7000, "[::1]:7000"),
    ("fe80::1", 1, "[fe80::1]:1"),
    ("lab-box", 80, "lab-box:80"),
])
def test_host_port_round_trips(host, port, text):
    assert join_host_port(host, port) == text
    assert split_host_port(text) == (host, port)
    assert host_of(text) == host

@pytest.mark.parametrize("text", ["", "127.0.0.1", "127.0.0.1:", "127.0.0.1:x", ":"])
def test_not_host_port(text):
    with pytest.raises(ValueError):
        split_host_port(text)

@pytest.mark.parametrize("text, ok", [
    ("127.0.0.1:7000", True), ("[::1]:7000", True), ("127.0.0.1:0", False), ("127.0.0.1:65536", False),
    ("localhost:7000", False), ("127.0.0.1", False), (7000, False), ("[::1]", False),
])
def test_valid_address_wants_an_ip_and_a_port(text, ok):
    assert valid_address(text) is ok

@given(st.ip_addresses(), st.integers(1, 65535))
def test_every_ip_and_port_makes_a_valid_address(ip, port):
    assert valid_address(join_host_port(str(ip), port))
    assert split_host_port(join_host_port(str(ip), port)) == (str(ip), port)
