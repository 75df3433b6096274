"""A burst far above capacity: fast, explicit refusals, then normal service.

Starts its own TorchServe (optionally with a smaller job queue or fewer workers, to put the
burst far above capacity on a 2-core machine), releases ``--burst`` concurrent requests at
once, and reports how many were answered 200 and how many refused with 503 (and how fast),
then checks that sequential requests right after the burst all succeed.

Client-side latencies include the load generator's own thread scheduling (hundreds of
Python threads on 2 cores); the server-side figures come from TorchServe's access log.

    make bench-overload
    .venv/bin/python -m bench.overload --burst 400 --queue 8 --workers 1
"""

from __future__ import annotations

import json
import logging
import re
import statistics
import sys
import threading
import time

import requests

from bench import common
from rtserve.client.rest import QUEUE_FULL
from rtserve.server.readiness import sample_payload
from rtserve.server.torchserve import TorchServe

logger = logging.getLogger(__name__)


def _ms(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * (len(values) - 1)))] * 1000, 1)


def burst(url: str, key: str, n: int, timeout: float = 60.0) -> list[tuple]:
    """``n`` requests released together (a barrier); returns (status, seconds, body) each."""
    body = json.dumps(sample_payload()).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    barrier = threading.Barrier(n)
    results: list[tuple] = []
    lock = threading.Lock()

    def one() -> None:
        session = requests.Session()
        barrier.wait()
        start = time.perf_counter()
        try:
            resp = session.post(url, data=body, headers=headers, timeout=timeout)
            outcome = (resp.status_code, time.perf_counter() - start, resp.text)
        except requests.RequestException as exc:
            outcome = (type(exc).__name__, time.perf_counter() - start, str(exc))
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    return results


def access_log_latencies(server: TorchServe, model: str) -> list[tuple[int, int]]:
    """(status, milliseconds) of each prediction in TorchServe's access log, oldest first."""
    pattern = re.compile(rf'"POST /predictions/{re.escape(model)} HTTP/1.1" (\d+) (\d+)$')
    path = server.log_dir / "access_log.log"
    text = path.read_text() if path.exists() else ""
    return [(int(m.group(1)), int(m.group(2))) for m in map(pattern.search, text.splitlines()) if m]


def logged_after(server: TorchServe, model: str, before: int, n: int, timeout: float = 10.0) -> list[tuple[int, int]]:
    """The ``n`` access-log entries after the first ``before``, once the frontend's asynchronous
    appender has written them all (or what is there after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        found = access_log_latencies(server, model)[before:]
        if len(found) >= n or time.monotonic() > deadline:
            return found[:n]
        time.sleep(0.05)


def run(server: TorchServe, model: str, n: int, after: int = 100) -> dict:
    """Burst, then ``after`` sequential requests; return the report."""
    client = server.client()
    desc = client.describe(model)[0]
    url = common.predictions_url(server, model)
    key = client.keys.get("inference")
    logged = len(access_log_latencies(server, model))
    results = burst(url, key, n)
    server_ms = logged_after(server, model, logged, n)
    ok = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 503]
    other = [r for r in results if r[0] not in (200, 503)]
    messages = {json.loads(r[2]).get("message", "") for r in refused}
    session = requests.Session()
    after_lat, after_ok = [], 0
    for _ in range(after):
        start = time.perf_counter()
        resp = session.post(url, json=sample_payload(), headers={"Authorization": f"Bearer {key}"}, timeout=30)
        after_lat.append(time.perf_counter() - start)
        after_ok += resp.status_code == 200
    return {
        "burst": n,
        "queue_size": int(server.props.get("job_queue_size", 100)),
        "workers": len(desc["workers"]),
        "batch_size": desc["batchSize"],
        "ok": len(ok),
        "refused_503": len(refused),
        "other": len(other),
        "other_examples": [str(r[:2]) + r[2][:100] for r in other[:3]],
        "refusals_say_queue_full": all(QUEUE_FULL in m for m in messages),
        "refusal_message": sorted(messages)[0] if messages else "",
        "refusal_body": refused[0][2] if refused else "",
        "ok_p50_ms": _ms([r[1] for r in ok], 0.5),
        "ok_max_ms": _ms([r[1] for r in ok], 1.0),
        "refused_p50_ms": _ms([r[1] for r in refused], 0.5),
        "refused_max_ms": _ms([r[1] for r in refused], 1.0),
        "server_logged": len(server_ms),
        "server_refused_503": sum(1 for code, _ in server_ms if code == 503),
        "server_ok_max_ms": max((ms for code, ms in server_ms if code == 200), default=None),
        "server_refused_max_ms": max((ms for code, ms in server_ms if code == 503), default=None),
        "after_ok": after_ok,
        "after_sent": after,
        "after_p50_ms": round(statistics.median(after_lat) * 1000, 2),
    }


def main(argv: list[str] | None = None) -> int:
    """Start a server (or attach to one), run the burst, print and save the report."""
    parser = common.parser(__doc__, "overload.json")
    parser.add_argument("--burst", type=int, default=800)
    parser.add_argument("--after", type=int, default=100, help="sequential requests after the burst")
    parser.add_argument("--queue", type=int, help="job_queue_size override (default: config.properties)")
    parser.add_argument("--workers", type=int, help="scale the model to this many workers first")
    args = parser.parse_args(argv)
    common.log_to_stdout()
    overrides = {"job_queue_size": str(args.queue)} if args.queue else None
    with common.serving(args, "bench-overload", overrides=overrides) as server:
        if args.workers:
            server.client(timeout=120).scale(args.model, args.workers)
        report = run(server, args.model, args.burst, args.after)
    # The server-side figures count only if the access log holds every request of the burst,
    # its 503s the ones the client saw.
    return common.finish(
        report,
        args.out,
        json.dumps(report, indent=2),
        report["other"] == 0
        and report["after_ok"] == report["after_sent"]
        and report["server_logged"] == report["burst"]
        and report["server_refused_503"] == report["refused_503"],
    )


if __name__ == "__main__":
    sys.exit(main())
