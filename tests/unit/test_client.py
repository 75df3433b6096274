"""rtserve's client policies that need no server."""

import pytest

from rtserve.client import worker_lost

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("status,body,expected", [
    (500, '{"code": 500, "type": "InternalServerException", "message": "Worker scaled down."}', True),
    (507, '{"code": 507, "type": "InternalServerException", "message": "Worker died."}', True),
    (500, '{"code": 500, "message": "Prediction failed"}', False),   # a handler error: not resent
    (503, '{"code": 503, "message": "Worker died."}', False),
    (400, '{"error": "Worker died."}', False),                          # a client error is final
])
def test_only_a_lost_worker_makes_a_prediction_resendable(status, body, expected):
    assert worker_lost(status, body) is expected
