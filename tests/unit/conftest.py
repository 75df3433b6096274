"""Unit-tier fixtures: the handler initialized on freshly trained artifacts, no server."""

import pytest

from handler.rtserve_handler import RealTimeHandler
from tests.helpers import MODEL_YAML, make_context


def _give_server_env(mp: pytest.MonkeyPatch, root) -> None:
    """What rtserve.server gives TorchServe's workers: a metrics directory (the handler's
    Prometheus files) and a log directory (its audit trail)."""
    (root / "metrics").mkdir(exist_ok=True)
    (root / "logs").mkdir(exist_ok=True)
    mp.setenv("PROMETHEUS_MULTIPROC_DIR", str(root / "metrics"))
    mp.setenv("LOG_LOCATION", str(root / "logs"))


@pytest.fixture(scope="package", autouse=True)
def session_server_env(tmp_path_factory):
    """The server environment for every unit test (module-scoped handlers included), undone
    after the last one: a later tier's servers must not inherit its LOG_LOCATION."""
    with pytest.MonkeyPatch.context() as mp:
        _give_server_env(mp, tmp_path_factory.mktemp("server_env"))
        yield


@pytest.fixture()
def server_env(tmp_path, monkeypatch):
    """A server environment of this test's own (its audit.log holds only this test's lines)."""
    _give_server_env(monkeypatch, tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def handler_ctx(trained_dir):
    """The handler and its real TorchServe context, initialized with the shipped model config."""
    ctx = make_context(trained_dir, MODEL_YAML)
    handler = RealTimeHandler()
    handler.initialize(ctx)
    return handler, ctx
