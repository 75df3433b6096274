"""Free loopback ports for the processes rtserve starts (tests, benchmarks, local servers)."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """Reserve ``count`` distinct free loopback TCP ports (released just before use)."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports
