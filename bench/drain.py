"""Stopping a server under load, as Kubernetes does: plain SIGTERM against drain-then-SIGTERM.

Each run starts its own TorchServe (free loopback ports), keeps heavy concurrent traffic on it
(``Connection: close``, so every request opens its own connection and a refused connect is
unambiguous), then stops it the way a kubelet stops a pod: readiness goes false (the drain
marker ``RUN_DIR/draining``) and the router, here the load generator's ``gate``, stops sending
``--lag`` seconds later, like an endpoints update reaching kube-proxy or an ingress. Then:

* ``plain``: SIGTERM at once, TorchServe 0.12.0's own shutdown. Requests it had accepted (queued
  or in a worker) are dropped: the client sees its connection reset.
* ``drain``: ``TorchServe.stop(drain=True)``: wait until no request arrives, is queued or runs for
  ``--quiet`` seconds, then SIGTERM.

Afterwards a few requests are sent straight to the stopped server: each must be refused at
connect time. A request is *lost* if the server accepted its connection and never answered.
Every count is of first tries (what a client sees before any resend of its own); the load
resends a "Worker died." once, as rtserve's client does, and the report counts those resends and
what still failed after them.

    make bench-drain                          # both modes, about 40 s
    .venv/bin/python -m bench.drain --mode drain --concurrency 16
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter

import requests

from bench import common
from bench.loadgen import Counts, connection_refused, status_key
from rtserve.server.drain import mark_draining
from rtserve.server.readiness import sample_payload
from rtserve.server.torchserve import TorchServe

logger = logging.getLogger(__name__)


class ReadinessRouter:
    """Routes to the server while it is ready, and for ``lag`` seconds after it stopped being.

    Stands in for the endpoints controller and kube-proxy (or an ingress): they notice a failed
    readiness probe only after a probe period and an update, during which traffic still arrives.
    """

    def __init__(self, server: TorchServe, lag: float) -> None:
        self.server = server
        self.lag = lag
        self.not_ready_since: float | None = None
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        if not self.server.draining:
            return True
        with self._lock:
            if self.not_ready_since is None:
                self.not_ready_since = time.monotonic()
        return time.monotonic() - self.not_ready_since < self.lag


def probe_stopped(url: str, n: int = 5) -> list[str]:
    """Send ``n`` requests to a stopped server; ``refused`` for each refused connect."""
    out = []
    for _ in range(n):
        try:
            resp = requests.post(url, json=sample_payload(), timeout=5)
            out.append(f"answered {resp.status_code}")
        except requests.RequestException as exc:
            out.append("refused" if connection_refused(exc) else f"{type(exc).__name__}: {exc}"[:120])
    return out


def run(
    server: TorchServe,
    model: str,
    mode: str,
    hold: float = 2.0,
    lag: float = 0.5,
    rate: float = 2000.0,
    concurrency: int = 16,
    quiet: float = 0.5,
    drain_timeout: float = 30.0,
) -> dict:
    """Load a ready ``server``, stop it in ``mode`` (``plain`` or ``drain``), return the report."""
    url = common.predictions_url(server, model)
    load = common.steady_load(
        server,
        model,
        rate,
        concurrency,
        hold + drain_timeout + 120,
        timeout=30.0,
        keep_alive=False,
        gate=ReadinessRouter(server, lag),
    )
    drain_report = None
    load.start("before stop")
    try:
        time.sleep(hold)
        load.mark("stopping")
        started = time.monotonic()
        if mode == "drain":
            drain_report = server.drain(timeout=drain_timeout, quiet=quiet)
        else:
            mark_draining(server.run_dir, server.pid())  # readiness false, then no wait
        sigterm_at = time.monotonic() - started
        server.stop()
        stopped_at = time.monotonic() - started
        load.mark("after stop")
        time.sleep(0.3)
    finally:
        records = load.stop()
    after = probe_stopped(url)
    # First tries: a try that got no answer was never resent, so its `refused` is the first's.
    answered = [r for r in records if r.first_status != 0]
    lost = [r for r in records if r.first_status == 0 and not r.refused]
    return {
        "mode": mode,
        "concurrency": concurrency,
        "lag_s": lag,
        "quiet_s": quiet,
        "requests": len(records),
        "answered": len(answered),
        "answered_200": sum(1 for r in answered if r.first_status == 200),
        "answered_other": dict(Counter(status_key(r.first_status) for r in answered if r.first_status != 200)),
        "refused": sum(1 for r in records if r.first_status == 0 and r.refused),
        "lost": len(lost),
        "lost_errors": dict(Counter(_short(r.first_error) for r in lost)),
        **vars(Counts.of(records)),
        "during_stop": sum(1 for r in records if r.phase == "stopping"),
        "sigterm_after_s": round(sigterm_at, 2),
        "stopped_after_s": round(stopped_at, 2),
        "drain": drain_report.as_dict() if drain_report else None,
        "after_stop": after,
    }


def _short(error: str) -> str:
    for needle, text in (
        ("reset by peer", "connection reset by peer"),
        ("without response", "connection closed without a response"),
        ("timed out", "read timed out"),
    ):
        if needle in error:
            return text
    return error[:100]


def render(report: dict) -> str:
    """One report as text."""
    lines = [
        f"[{report['mode']}] {report['requests']} requests ({report['concurrency']} concurrent, "
        f"router lag {report['lag_s']} s): answered {report['answered']} "
        f"(200: {report['answered_200']}, other: {report['answered_other'] or 0}), "
        f"refused at connect {report['refused']}, LOST {report['lost']}",
        f"  {report['during_stop']} requests started after readiness went false; SIGTERM after "
        f"{report['sigterm_after_s']} s, process gone after {report['stopped_after_s']} s",
    ]
    if report["drain"]:
        d = report["drain"]
        lines.append(
            f"  drain: idle={d['drained']} after {d['seconds']} s ({d['arrivals']} arrived "
            f"while draining, peak {d['peak_pending']} queued, peak {d['peak_busy']} "
            f"workers busy)"
        )
    lines += [f"  lost: {n} x {e}" for e, n in report["lost_errors"].items()]
    lines.append(f"  {Counts.read(report).text()}")
    lines.append(f"  requests sent after the stop: {', '.join(report['after_stop'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the chosen modes, each on its own server; print and save the reports."""
    parser = common.parser(__doc__, "drain.json", attach=False)  # it stops the server
    parser.add_argument("--mode", choices=["plain", "drain", "both"], default="both")
    parser.add_argument("--hold", type=float, default=3.0, help="seconds of traffic before the stop")
    parser.add_argument("--lag", type=float, default=1.0, help="router lag after readiness goes false")
    parser.add_argument("--quiet", type=float, default=1.0, help="drain: idle seconds required")
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    common.log_to_stdout()
    reports = []
    for mode in ["plain", "drain"] if args.mode == "both" else [args.mode]:
        with common.serving(args, f"bench-drain-{mode}") as server:
            reports.append(run(server, args.model, mode, args.hold, args.lag, args.rate, args.concurrency, args.quiet))
    ok = all(r["lost"] == 0 and r["answered_other"] == {} for r in reports if r["mode"] == "drain")
    return common.finish(reports, args.out, "\n".join(map(render, reports)), ok)


if __name__ == "__main__":
    sys.exit(main())
