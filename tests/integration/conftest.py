"""A real TorchServe on free loopback ports, serving the Makefile-built archive."""

from __future__ import annotations

import pytest

from rtserve.runtime.ports import free_ports
from rtserve.server.properties import port_overrides
from rtserve.server.torchserve import TorchServe
from tests.conftest import MODEL_NAME


def start_server(run_dir, mar, models=None, overrides_extra=None, **kwargs) -> TorchServe:
    """Start TorchServe from the project's config with every listener on a free port."""
    overrides = {**port_overrides(free_ports(6)), **(overrides_extra or {})}
    server = TorchServe(run_dir, mar.parent, models if models is not None else [f"{MODEL_NAME}={mar.name}"],
                        overrides=overrides, **kwargs)
    server.start()
    return server


@pytest.fixture(scope="module")
def server(mar_v1, tmp_path_factory):
    """One server per test module, polled ready with a timeout, stopped in ``finally``."""
    ts = start_server(tmp_path_factory.mktemp("run"), mar_v1)
    try:
        ts.wait_ready(timeout=120, models=[MODEL_NAME])
        yield ts
    finally:
        ts.stop()
