"""Cost of ``rtserve_request_duration_seconds`` per request (``make bench-latency-histogram``).

The request path pays nothing new: the access-log line the histogram reads is the one TorchServe
writes anyway (an asynchronous log4j2 appender, as shipped). The cost is the exporter's CPU for
reading, parsing and observing each line (:class:`rtserve.observability.request_latency.RequestLatency`), on
the same cores as the server; this measures it per line over a realistic access log.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from rtserve.observability.request_latency import RequestLatency

LINE = '2026-11-30T04:54:27,{ms:03d} - /127.0.0.1:{port} "POST /predictions/realtime-classifier HTTP/1.1" {status} {took}\n'


def access_log(n: int) -> str:
    """``n`` lines like TorchServe's: mostly 200s, a few 400/503, one /ping in 50."""
    lines = []
    for i in range(n):
        if i % 50 == 0:
            lines.append(f'2026-11-30T04:54:27,{i % 1000:03d} - /127.0.0.1:40000 "GET /ping HTTP/1.1" 200 0\n')
        else:
            status = 503 if i % 97 == 0 else 400 if i % 31 == 0 else 200
            lines.append(LINE.format(ms=i % 1000, port=40000 + i % 64, status=status, took=i % 23))
    return "".join(lines)


def measure(n: int, repeats: int) -> float:
    """Best seconds per line over ``repeats`` runs of ``n`` lines."""
    best = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "access_log.log"
        text = access_log(n)
        for _ in range(repeats):
            log.write_text("")
            latency = RequestLatency(log, CollectorRegistry())
            log.write_text(text)
            start = time.perf_counter()
            counted = latency.poll()
            best = min(best, (time.perf_counter() - start) / n)
            assert counted == n - len(range(0, n, 50))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    per_line = measure(args.lines, args.repeats)
    print("request-path cost: 0 (reads the access-log line TorchServe already writes)")
    print(
        f"exporter CPU per request (read + parse + observe, best of {args.repeats} x {args.lines} lines): "
        f"{per_line * 1e6:.2f} us"
    )
    print(f"at 5,000 requests/s that is {per_line * 5000 * 100:.1f}% of one core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
