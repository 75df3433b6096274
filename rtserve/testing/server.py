"""A TorchServe for one run on free loopback ports: started, polled ready, stopped afterwards.

What the tests' server fixtures and the benchmarks share (``tests/integration/conftest.py``,
``bench/common.py``, ``bench/perf.py``): every listener on a port reserved just before, so runs
side by side never collide; readiness as ``make serve`` waits for it; a stop in ``finally``.
A reserved port is free again until the frontend binds it, seconds later on a busy machine: when
another process took one meanwhile, the server is started again on fresh ports.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

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


def on_free_ports(run_dir: Path, model_store: Path, models: Sequence[str],
                  overrides: dict[str, str] | None = None, **kwargs) -> TorchServe:
    """A TorchServe (not started) serving ``models`` (``NAME=FILE.mar``) with every listener on
    a free loopback port, then ``overrides``; ``kwargs`` go to :class:`TorchServe`."""
    return TorchServe(run_dir, model_store, list(models),
                      overrides={**free_port_overrides(), **(overrides or {})}, **kwargs)


@contextmanager
def serving(run_dir: Path, model_store: Path, models: Sequence[str],
            overrides: dict[str, str] | None = None, ready: Sequence[str] | None = None,
            timeout: float = READY_TIMEOUT, **kwargs) -> Iterator[TorchServe]:
    """:func:`on_free_ports`, started and ready (``ready``: the models that must answer a
    prediction, default all of ``models``), stopped when the block ends. When a port it chose
    was taken before the frontend bound it, it starts again on fresh ports (at most
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
            logger.warning("start %d of %d lost a port, starting again on fresh ports: %s",
                           attempt, START_ATTEMPTS, str(exc).splitlines()[0])
        except BaseException:
            server.stop()
            raise
    try:
        yield server
    finally:
        server.stop()
