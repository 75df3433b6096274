"""A real TorchServe on free loopback ports, serving the Makefile-built archive
(:mod:`rtserve.testing.server`, the helper the benchmarks use too)."""

from __future__ import annotations

import pytest

from rtserve.server.torchserve import TorchServe
from rtserve.testing.server import READY_TIMEOUT, on_free_ports, serving
from tests.conftest import MODEL_NAME


def models_of(mar, models=None) -> list[str]:
    """``models``, or the archive ``mar`` as the demo model."""
    return models if models is not None else [f"{MODEL_NAME}={mar.name}"]


def start_server(run_dir, mar, models=None, overrides_extra=None, **kwargs) -> TorchServe:
    """Start TorchServe from the project's config with every listener on a free port."""
    server = on_free_ports(run_dir, mar.parent, models_of(mar, models), overrides_extra, **kwargs)
    server.start()
    return server


def serve(run_dir, mar, models=None, overrides_extra=None, ready=(MODEL_NAME,), timeout=READY_TIMEOUT, **kwargs):
    """:func:`start_server`, polled ready with a timeout, stopped when the block ends."""
    return serving(run_dir, mar.parent, models_of(mar, models), overrides_extra, ready, timeout, **kwargs)


@pytest.fixture(scope="module")
def server(mar_v1, tmp_path_factory):
    """One server per test module, polled ready with a timeout, stopped in ``finally``."""
    with serve(tmp_path_factory.mktemp("run"), mar_v1) as ts:
        yield ts
