"""Unit-tier fixtures: the handler initialized on freshly trained artifacts, no server."""

import pytest

from handler.rtserve_handler import RealTimeHandler
from tests.helpers import MODEL_YAML, make_context


@pytest.fixture(scope="module")
def handler_ctx(trained_dir):
    """The handler and its real TorchServe context, initialized with the shipped model config."""
    ctx = make_context(trained_dir, MODEL_YAML)
    handler = RealTimeHandler()
    handler.initialize(ctx)
    return handler, ctx
