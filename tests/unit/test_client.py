"""rtserve's client policies that need no server."""

import pytest

from rtserve.client.rest import retryable, worker_lost

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "status,body,expected",
    [
        (500, '{"code": 500, "type": "InternalServerException", "message": "Worker scaled down."}', True),
        (507, '{"code": 507, "type": "InternalServerException", "message": "Worker died."}', True),
        (500, '{"code": 500, "message": "Prediction failed"}', False),  # a handler error: not resent
        (503, '{"code": 503, "message": "Worker died."}', False),
        (400, '{"error": "Worker died."}', False),  # a client error is final
    ],
)
def test_only_a_lost_worker_makes_a_prediction_resendable(status, body, expected):
    assert worker_lost(status, body) is expected


@pytest.mark.parametrize(
    "status,body,expected",
    [
        (503, '{"code": 503, "message": "Service unavailable"}', True),
        (500, '{"code": 500, "type": "ConcurrentModificationException"}', True),  # TorchServe's race
        (500, '{"code": 500, "type": "InternalServerException", "message": "boom"}', False),
        (400, '{"code": 400, "type": "BadRequestException"}', False),
        (404, '{"code": 404, "type": "ModelNotFoundException"}', False),
    ],
)
def test_idempotent_calls_are_resent_only_for_transient_answers(status, body, expected):
    """What `scale` (idempotent) sends again: TorchServe 0.12 answers a scale-down under traffic
    `500 {"type": "ConcurrentModificationException"}` now and then (make bench-rollout met it)."""
    assert retryable(status, body) is expected
