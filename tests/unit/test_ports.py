"""rtserve.runtime.ports: free listening ports outside the kernel's ephemeral range."""

import socket

import pytest

from rtserve.runtime import ports

pytestmark = pytest.mark.unit


def test_ports_are_free_distinct_and_below_the_ephemeral_range():
    low, _ = ports.ephemeral_range()
    found = ports.free_ports(6)
    assert len(set(found)) == 6
    assert all(ports.LOWEST <= p < low for p in found) or low - ports.LOWEST < 1000
    for port in found:  # each can be bound now
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_listening_range_follows_the_kernel_file(tmp_path):
    conf = tmp_path / "ip_local_port_range"
    conf.write_text("32768\t60999\n")
    assert ports.listening_range(ports.ephemeral_range(conf)) == range(10000, 32768)
    conf.write_text("10500 60999\n")  # no room below: above the range instead
    assert ports.listening_range(ports.ephemeral_range(conf)) == range(61000, 65536)
    conf.write_text("garbage")
    assert ports.ephemeral_range(conf) == ports.DEFAULT_EPHEMERAL


def test_a_taken_port_is_never_handed_out_and_exhaustion_is_an_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        taken.listen()
        with pytest.raises(OSError, match=f"no 1 free loopback ports in {port}-{port}"):
            ports.free_ports(1, range(port, port + 1))


def test_excluded_ports_are_never_handed_out():
    """A server's own listeners' ports are free until it binds them: never handed out again."""
    first = ports.free_ports(6)
    assert not set(ports.free_ports(6, exclude=first)) & set(first)
    free = first[0]
    with pytest.raises(OSError, match=f"no 1 free loopback ports in {free}-{free}"):
        ports.free_ports(1, range(free, free + 1), exclude=[free])
