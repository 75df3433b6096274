"""A TorchServe for one run on free loopback ports: started, polled ready, stopped afterwards.

What the tests' server fixtures and the benchmarks share (``tests/integration/conftest.py``,
``bench/common.py``, ``bench/perf.py``): every listener on a port reserved just before, so runs
side by side never collide; readiness as ``make serve`` waits for it; a stop in ``finally``.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from rtserve.runtime.ports import free_ports
from rtserve.server.properties import port_overrides
from rtserve.server.torchserve import TorchServe


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
            timeout: float = 300.0, **kwargs) -> Iterator[TorchServe]:
    """:func:`on_free_ports`, started and ready (``ready``: the models that must answer a
    prediction, default all of ``models``), stopped when the block ends.

    Raises:
        ServerError: it did not start or become ready within ``timeout`` (it is stopped).
    """
    server = on_free_ports(run_dir, model_store, models, overrides, **kwargs)
    server.start()
    try:
        server.wait_ready(timeout, [m.split("=", 1)[0] for m in models] if ready is None
                          else list(ready))
        yield server
    finally:
        server.stop()
