"""Whether a served model answers: its workers are READY, and a real prediction comes back."""

from __future__ import annotations

from handler.records import ROUTE_HEADER
from rtserve.client.rest import Client, TorchServeError


def workers_ready(client: Client, model: str, version: str | None = None) -> bool:
    """Whether the model's (default) version has at least ``minWorkers`` workers READY."""
    desc = client.describe(model, version)[0]
    ready = sum(1 for w in desc.get("workers", []) if w.get("status") == "READY")
    return ready >= max(1, int(desc.get("minWorkers", 1)))


def sample_payload(n_features: int = 32) -> dict:
    """A valid request body (the demo's payload shape) used for readiness checks."""
    return {"features": [0.0] * n_features}


#: The route of the readiness probe's predictions in their records.
PROBE_ROUTE = "probe"


def probe_prediction(client: Client, model: str) -> dict:
    """One prediction of all-zero features from ``model``, whatever its feature count.

    The demo's 32 first; a model with another count answers 400 with the count it expects (the handler's
    ``X-Rtserve-Expected-Count``, :attr:`TorchServeError.expected`), and gets that many. The client's requests are
    marked as the probe's from then on (their records' route is ``probe``: :data:`handler.records.ROUTE_HEADER`).

    Raises:
        TorchServeError: the model did not answer a prediction.
    """
    client.session.headers[ROUTE_HEADER] = PROBE_ROUTE
    try:
        return client.predict(model, sample_payload())
    except TorchServeError as exc:
        if exc.status != 400 or exc.expected is None:
            raise
        return client.predict(model, sample_payload(exc.expected))
