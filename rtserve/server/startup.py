"""Why a TorchServe frontend exited during start-up, read from its console output (``launcher.log``).

The frontend exits when a listener fails to bind, and only its console output holds the Java stack trace
(``Failed to bind to address ...``, then ``Caused by: ... Address already in use``); its own log does not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from rtserve.server.properties import OIP_KEY, PUBLIC_METRICS_KEY

BIND_FAILED = re.compile(r"Failed to bind to address:? (?P<address>\S+)")
BIND_CAUSE = re.compile(r"bind\(\.\.\) failed: (?P<reason>.+)$", re.MULTILINE)
ADDRESS_IN_USE = "Address already in use"
#: A line of the frontend's output saying why it stopped: a Java exception (``java.lang.X:
#: message``, ``Caused by: ...``) or its own ``Invalid configuration: ...``.
FRONTEND_ERROR = re.compile(
    r"^(?:(?:Caused by: )?(?:[A-Za-z_$][\w$]*\.)+[\w$]*(?:Exception|Error)\b"
    r"|Invalid configuration:).*$",
    re.MULTILINE,
)
#: The effective config's listeners: the frontend's own, then those of rtserve's sidecars.
LISTENER_KEYS = (
    "inference_address",
    "management_address",
    "metrics_address",
    "grpc_inference_port",
    "grpc_management_port",
    PUBLIC_METRICS_KEY,
    OIP_KEY,
)


@dataclass(frozen=True)
class BindFailure:
    """A listener the frontend could not bind.

    Attributes:
        address: as the frontend printed it (``http://127.0.0.1:8080``, ``/127.0.0.1:7070``).
        port: its port (None when the address has none).
        reason: the system's reason (``Address already in use``), or "" when not printed.
    """

    address: str
    port: int | None
    reason: str

    @property
    def in_use(self) -> bool:
        """Whether another socket held the port (another process, or another listener)."""
        return self.reason == ADDRESS_IN_USE


def port_of(address: str) -> int | None:
    """The port of a listener's address: a URL, ``/host:port``, ``host:port`` or a bare port."""
    text = address.strip()
    if text.isdigit():
        return int(text)
    try:
        return urlsplit(text if "//" in text else f"//{text.lstrip('/')}").port
    except ValueError:
        return None


def listener_ports(props: Mapping[str, str]) -> dict[int, list[str]]:
    """The TCP ports a config's listeners use, each with the keys that name it."""
    found: dict[int, list[str]] = {}
    for key in LISTENER_KEYS:
        port = port_of(props[key]) if props.get(key) else None
        if port is not None:
            found.setdefault(port, []).append(key)
    return found


def bind_failure(output: str) -> BindFailure | None:
    """The listener the frontend's output says it could not bind (the first), if any."""
    failed = BIND_FAILED.search(output)
    if failed is None:
        return None
    cause = BIND_CAUSE.search(output, failed.end())
    address = failed["address"]
    return BindFailure(address, port_of(address), cause["reason"].strip() if cause else "")


def first_error(output: str) -> str | None:
    """The first line of the frontend's output that says why it stopped (:data:`FRONTEND_ERROR`)."""
    found = FRONTEND_ERROR.search(output)
    return found.group(0).strip() if found else None


def exit_reason(output: str, props: Mapping[str, str]) -> str:
    """Why the frontend exited, in one line, from its output and the effective config it ran with.

    "" when its output does not say.
    """
    failure = bind_failure(output)
    if failure is not None:
        keys = listener_ports(props).get(failure.port, []) if failure.port is not None else []
        named = f" ({', '.join(keys)})" if keys else ""
        why = failure.reason or "bind failed"
        shared = (
            f"; that port is configured for {len(keys)} listeners"
            if len(keys) > 1
            else "; another process took the port"
            if failure.in_use
            else ""
        )
        return f"it could not listen on {failure.address}{named}: {why}{shared}"
    error = first_error(output)
    return f"the frontend failed: {error}" if error else ""
