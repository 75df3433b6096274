"""The gate's live measurements: rows answered by a running TorchServe, and a timed burst.

Every request is a plain ``/predictions/{model}/{version}`` call through :class:`Client` (token
auth as usual); the number of requests is bounded by :class:`rtserve.promotion.gate.GateConfig`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from handler.signature import answer_numbers, golden_values
from rtserve.client.rest import Client
from rtserve.errors import GateError, GoldenMismatch
from rtserve.model.archive import golden_mismatches
from rtserve.promotion.gate import ArchiveMeta, GateConfig, percentile
from rtserve.promotion.kinds import answer_value


def answer_rows(
    client: Client, model: str, version: str | None, rows: Sequence[Sequence[float]], concurrency: int
) -> list[dict]:
    """Each row's answer (``prediction``, ``label``, ``probabilities``), in row order."""
    local = threading.local()

    def one(row):
        if not hasattr(local, "client"):  # one HTTP session per thread
            local.client = Client(
                client.inference_url,
                client.management_url,
                key_file=client.keys.path,
                timeout=client.timeout,
                token=client.keys.get("inference") if client.keys.path is None else None,
            )
        return local.client.predict(model, {"features": list(row)}, version)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, rows))


def answer_values(
    client: Client, model: str, version: str, kind: str, rows: Sequence[Sequence[float]], concurrency: int
) -> list:
    """Each row's answer as the gate compares it (:func:`rtserve.promotion.kinds.answer_value` of ``kind``).

    Raises:
        GateError: an answer is not one of ``kind`` (the version and the row named).
    """
    values = []
    for i, answer in enumerate(answer_rows(client, model, version, rows, concurrency)):
        try:
            values.append(answer_value(kind, answer))
        except (KeyError, TypeError, ValueError) as exc:
            raise GateError(
                f"{model} {version} answered row {i} with no {kind} answer ({type(exc).__name__}: {exc}): "
                f"{str(answer)[:200]}"
            ) from exc
    return values


def check_golden(client: Client, model: str, version: str | None, meta: ArchiveMeta, config: GateConfig) -> int:
    """Replay ``meta``'s golden set through the server; returns the number of rows checked.

    Raises:
        GoldenMismatch: rows whose served probabilities differ from the packaging-time ones.
    """
    answers = answer_rows(client, model, version, meta.golden["features"], config.concurrency)
    signature = meta.outputs or [meta.output or {"kind": "classification"}]
    got = [answer_numbers(signature, a) for a in answers]  # every output's probabilities, values or vectors
    want = golden_values(meta.golden)
    bad = golden_mismatches(want, got, config.golden_tolerance)
    if bad:
        worst = max(max((abs(a - b) for a, b in zip(want[i], got[i])), default=float("inf")) for i in bad)
        raise GoldenMismatch(
            f"{model} {version or '(default)'} answers {len(bad)} of {len(got)} golden rows "
            f"differently from its archive (rows {bad[:10]}{' ...' if len(bad) > 10 else ''}; max "
            f"|difference| {worst:.3g}, tolerance {config.golden_tolerance}): the served model is "
            "not the one packaged (handler, preprocessing or a corrupt archive)"
        )
    return len(got)


def latency_burst(
    client: Client, model: str, versions: Sequence[str | None], row: Sequence[float], config: GateConfig
) -> dict:
    """Milliseconds per request for each version, after ``warmup_requests`` each.

    Requests are sequential, alternating between the versions so both see the same machine.
    """
    times: dict = {v: [] for v in versions}
    body = {"features": list(row)}
    for i in range(config.warmup_requests + config.burst_requests):
        for version in versions:
            start = time.perf_counter()
            client.predict(model, body, version)
            if i >= config.warmup_requests:
                times[version].append((time.perf_counter() - start) * 1000.0)
    return times


def verify_served(client: Client, model: str, meta: ArchiveMeta, config: GateConfig) -> dict:
    """What ``make k8s-verify`` checks of the version a Service serves (no second version to compare).

    Its answers equal its archive's golden set, and its p99 over a burst is at most ``max_p99_ms``.
    A burst over the limit is measured again, up to ``latency_attempts`` bursts in all, and the
    lowest p99 counts (as in the gate: one stall of a busy node does not roll a good version back;
    a slow one fails every burst). Returns the figures, each burst's p99 under ``attempts_p99_ms``.

    Raises:
        GoldenMismatch: the answers differ (rows named).
        GateError: the p99 is over the limit in every burst.
    """
    rows = check_golden(client, model, None, meta, config)
    bursts: list[list[float]] = []
    for _ in range(config.latency_attempts):
        bursts.append(latency_burst(client, model, (None,), meta.golden["features"][0], config)[None])
        if percentile(bursts[-1], 99) <= config.max_p99_ms:
            break
    burst = min(bursts, key=lambda b: percentile(b, 99))
    figures = {
        "model": model,
        "version": meta.version,
        "golden_rows": rows,
        "requests": len(burst),
        "p50_ms": round(percentile(burst, 50), 3),
        "p99_ms": round(percentile(burst, 99), 3),
        "max_p99_ms": config.max_p99_ms,
        "attempts_p99_ms": [round(percentile(b, 99), 3) for b in bursts],
    }
    if figures["p99_ms"] > config.max_p99_ms:
        raise GateError(
            f"{model} {meta.version}: p99 {figures['p99_ms']} ms over {len(burst)} "
            f"requests is above max_p99_ms {config.max_p99_ms} ms in each of "
            f"{len(bursts)} bursts ({figures})"
        )
    return figures
