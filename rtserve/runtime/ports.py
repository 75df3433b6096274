"""Free loopback ports for the processes rtserve starts (tests, benchmarks, local servers).

Ports are chosen below the kernel's ephemeral range (``ip_local_port_range``), so that no outgoing connection of
another process can take one between the moment it is found free and the moment a slow starter binds it.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection
from pathlib import Path

#: Where the kernel says its ephemeral range is, and the range assumed when it cannot be read.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)
#: The lowest port handed out (well above the well-known and common service ports).
LOWEST = 10000
#: At most this many candidates are tried per port asked for.
TRIES = 200


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (``DEFAULT_EPHEMERAL`` if it cannot be read)."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def listening_range(ephemeral: tuple[int, int] | None = None) -> range:
    """The ports handed out: from :data:`LOWEST` up to the ephemeral range.

    When that range leaves too little room below it, the ports above it.
    """
    low, high = ephemeral or ephemeral_range()
    if low - LOWEST >= 1000:
        return range(LOWEST, low)
    return range(high + 1, 65536)


def free_ports(count: int, ports: range | None = None, exclude: Collection[int] = ()) -> list[int]:
    """Reserve ``count`` distinct free loopback TCP ports outside the ephemeral range and ``exclude``.

    ``exclude`` holds ports handed out already, free until their process binds them. Each port is bound once to prove
    it free, and released just before use.

    Raises:
        OSError: no free port was found in :data:`TRIES` candidates per port.
    """
    candidates = ports if ports is not None else listening_range()
    rng = random.SystemRandom()
    socks: list[socket.socket] = []
    found: list[int] = []
    try:
        for _ in range(count * TRIES):
            if len(found) == count:
                break
            port = rng.randrange(candidates.start, candidates.stop)
            if port in found or port in exclude:
                continue
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
            found.append(port)
    finally:
        for sock in socks:
            sock.close()
    if len(found) < count:
        raise OSError(f"no {count} free loopback ports in {candidates.start}-{candidates.stop - 1}")
    return found
