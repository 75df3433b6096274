"""One Prometheus scrape for the whole server: TorchServe's frontend metrics plus the handler's.

``GET /metrics`` on ``metrics_address`` (TorchServe's listener moves to a loopback port) answers TorchServe's
scrape, the workers' multiprocess files (dead ones compacted, :mod:`~rtserve.observability.metrics_files`) and the
access log's latency histogram; it also caps the sidecars' outputs. ``server.torchserve.TorchServe`` runs it.
"""

from __future__ import annotations

import logging
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from rtserve.observability.metrics_files import compact
from rtserve.observability.request_latency import RequestLatency
from rtserve.runtime.logs import copy_truncate

logger = logging.getLogger(__name__)

#: A scrape of TorchServe that takes longer than this is reported as down for that scrape.
UPSTREAM_TIMEOUT = 5.0
UP_METRIC = "rtserve_torchserve_metrics_up"
#: Seconds between two reads of the access log (a scrape also reads it first).
ACCESS_LOG_POLL = 1.0
#: Seconds between two rounds of housekeeping (dead workers' metrics files, output files' caps).
HOUSEKEEPING_S = 1.0


class LatencySource:
    """The request latency histogram in its own registry, read under a lock.

    The poller thread and scrapes both catch up on the access log.
    """

    def __init__(self, access_log: Path, warmup_requests: int = 0) -> None:
        self.registry = CollectorRegistry()
        self.latency = RequestLatency(access_log, self.registry, warmup_requests=warmup_requests)
        self._lock = threading.Lock()

    def render(self) -> bytes:
        with self._lock:
            self.latency.poll()
            return generate_latest(self.registry)

    def follow(self, stop: threading.Event, every: float = ACCESS_LOG_POLL) -> None:
        """Catch up every ``every`` seconds until ``stop`` is set."""
        while not stop.wait(every):
            try:
                with self._lock:
                    self.latency.poll()
            except OSError as exc:
                logger.warning("reading the access log failed: %s", exc)


class WorkerMetrics:
    """The workers' metrics directory, scraped and compacted under one lock.

    So a scrape never sees a dead worker's file and the archive that absorbed it.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()

    def render(self) -> bytes:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.directory))
        with self._lock:
            return generate_latest(registry)

    def compact(self) -> None:
        """Merge the dead workers' files (:func:`~rtserve.observability.metrics_files.compact`)."""
        with self._lock:
            done = compact(self.directory)
        if done.merged or done.dropped:
            logger.info(
                "metrics of dead workers: %d files merged into the archive, %d dropped", done.merged, done.dropped
            )


def render(workers: WorkerMetrics, upstream: str | None, latency: LatencySource | None = None) -> bytes:
    """The scrape's body: TorchServe's metrics, the workers', then the request latency histogram.

    TorchServe's come from ``upstream``/metrics, the workers' from their files.
    """
    parts = []
    up = 0
    if upstream:
        try:
            with urllib.request.urlopen(f"{upstream}/metrics", timeout=UPSTREAM_TIMEOUT) as resp:
                parts.append(resp.read())
                up = 1
        except (OSError, urllib.error.URLError) as exc:
            logger.warning("TorchServe's metrics (%s) did not answer: %s", upstream, exc)
    parts.append(
        f"# HELP {UP_METRIC} Whether TorchServe's own metrics answered this scrape.\n"
        f"# TYPE {UP_METRIC} gauge\n{UP_METRIC} {up}\n".encode()
    )
    parts.append(workers.render())
    if latency is not None:
        parts.append(latency.render())
    return b"".join(p if p.endswith(b"\n") or not p else p + b"\n" for p in parts)


def housekeeping(
    workers: WorkerMetrics,
    outputs: Iterable[Path],
    output_bytes: int,
    stop: threading.Event,
    every: float = HOUSEKEEPING_S,
) -> None:
    """Compact the workers' metrics files and cap ``outputs``, every ``every`` seconds until ``stop``.

    Each of ``outputs`` stays within ``output_bytes`` (with its backup).
    """
    while not stop.wait(every):
        try:
            workers.compact()
        except (OSError, RuntimeError, ValueError) as exc:  # a torn file: tried again next round
            logger.warning("compacting the workers' metrics files failed: %s", exc)
        for path in outputs if output_bytes > 0 else ():
            if copy_truncate(path, output_bytes):
                logger.info("%s: over %d bytes, rotated to its backup", path, output_bytes // 2)


def make_server(
    listen: str, workers: WorkerMetrics, upstream: str | None, latency: LatencySource | None = None
) -> ThreadingHTTPServer:
    """An HTTP server answering ``GET /metrics`` on ``listen`` (``http://host:port``)."""
    address = urlsplit(listen)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            body = render(workers, upstream, latency)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args) -> None:  # scrapes are not worth a log line
            return

    server = ThreadingHTTPServer((address.hostname, address.port), Handler)
    server.daemon_threads = True
    return server


def serve(
    listen: str,
    upstream: str | None,
    multiproc_dir: Path,
    access_log: Path | None = None,
    warmup_requests: int = 0,
    outputs: Sequence[Path] = (),
    output_bytes: int = 0,
) -> int:
    """Serve ``/metrics`` on ``listen`` until SIGTERM/SIGINT (the exporter process's life).

    The first ``warmup_requests`` warm-up lines of the access log stay out of the histogram;
    meanwhile :func:`housekeeping` runs (``outputs`` within ``output_bytes`` each).
    """
    latency = LatencySource(access_log, warmup_requests) if access_log else None
    workers = WorkerMetrics(multiproc_dir)
    server = make_server(listen, workers, upstream, latency)
    stop = threading.Event()
    if latency is not None:
        threading.Thread(target=latency.follow, args=(stop,), daemon=True).start()
    threading.Thread(
        target=housekeeping, args=(workers, list(outputs), output_bytes, stop), daemon=True, name="rtserve-housekeeping"
    ).start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    logger.info("serving metrics on %s (TorchServe's from %s, workers' from %s)", listen, upstream, multiproc_dir)
    stop.wait()
    server.shutdown()
    server.server_close()
    return 0
