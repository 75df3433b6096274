"""A TorchServe for one run on free loopback ports: started, polled ready, stopped afterwards.

Shared by the tests' server fixtures and the benchmarks: every listener on a port reserved just
before, readiness as ``make serve`` waits for it, a stop in ``finally``. A reserved port is free again
until the frontend binds it: when another process took one meanwhile, the server starts again on fresh ports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from rtserve.errors import PortInUseError
from rtserve.runtime.ports import free_ports
from rtserve.server.properties import port_overrides
from rtserve.server.startup import listener_ports
from rtserve.server.torchserve import TorchServe

logger = logging.getLogger(__name__)

#: Seconds a test's or a benchmark's server gets to become ready (a busy 2-core machine).
READY_TIMEOUT = 300.0
#: Starts, on fresh ports each, before a port taken by another process fails the run.
START_ATTEMPTS = 3


def free_port_overrides() -> dict[str, str]:
    """Config overrides that put all six listeners on free loopback ports."""
    return port_overrides(free_ports(6))


def on_free_ports(
    run_dir: Path, model_store: Path, models: Sequence[str], overrides: dict[str, str] | None = None, **kwargs
) -> TorchServe:
    """A TorchServe (not started) serving ``models`` (``NAME=FILE.mar``) on free loopback ports.

    ``overrides`` apply over the free ports; ``kwargs`` go to :class:`TorchServe`.
    """
    return TorchServe(
        run_dir, model_store, list(models), overrides={**free_port_overrides(), **(overrides or {})}, **kwargs
    )


@contextmanager
def serving(
    run_dir: Path,
    model_store: Path,
    models: Sequence[str],
    overrides: dict[str, str] | None = None,
    ready: Sequence[str] | None = None,
    timeout: float = READY_TIMEOUT,
    **kwargs,
) -> Iterator[TorchServe]:
    """:func:`on_free_ports`, started and ready, stopped when the block ends.

    ``ready`` names the models that must answer a prediction (default all of ``models``). When a
    port it chose was taken before the frontend bound it, it starts again on fresh ports (at most
    :data:`START_ATTEMPTS` starts, all within ``timeout``).

    Raises:
        ServerError: it did not start or become ready within ``timeout`` (it is stopped).
        PortInUseError: a port given in ``overrides`` was taken, or each start lost a port.
    """
    pinned = listener_ports(overrides or {})
    names = [m.split("=", 1)[0] for m in models] if ready is None else list(ready)
    deadline = time.monotonic() + timeout
    for attempt in range(1, START_ATTEMPTS + 1):
        server = on_free_ports(run_dir, model_store, models, overrides, **kwargs)
        server.start()
        try:
            server.wait_ready(max(deadline - time.monotonic(), 1.0), names)
            break
        except PortInUseError as exc:
            server.stop()
            if attempt == START_ATTEMPTS or exc.port in pinned:
                raise
            logger.warning(
                "start %d of %d lost a port, starting again on fresh ports: %s",
                attempt,
                START_ATTEMPTS,
                str(exc).splitlines()[0],
            )
        except BaseException:
            server.stop()
            raise
    try:
        yield server
    finally:
        server.stop()
