"""End-to-end request latency from TorchServe's access log: ``rtserve_request_duration_seconds``.

The log's last field is the frontend's time from a decoded request to its answer in whole ms (the true time's
floor or ceil), so the bucket bounds sit half-way between whole ms. Only inference routes count, not the start's
warm-up requests (``rtserve_warmup`` in the URL). The exporter tails the log off the request path.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from handler.warmup import QUERY_PARAMETER
from rtserve.runtime.logs import LogFollower

METRIC = "rtserve_request_duration_seconds"
#: Bucket bounds in seconds: whole milliseconds + 0.5 ms (never on a reading's edge), from
#: sub-millisecond answers to 10 s (TorchServe's default response timeout is 120 s: anything
#: above 10 s is +Inf).
BUCKETS = tuple(
    round((ms + 0.5) / 1000.0, 4)
    for ms in (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 50, 75, 100, 150, 250, 500, 1000, 2500, 5000, 10000)
)
LABELS = ("model_name", "model_version", "status_class")
#: The frontend's route when a request names no version (as TorchServe's own metrics label it).
DEFAULT_VERSION = "default"
#: Status classes whose series start at zero as soon as a model is seen (a counter series that
#: appears with its first error would hide that error from ``rate()``).
STATUS_CLASSES = ("2xx", "4xx", "5xx")
#: At most this many (model, version) pairs get their own series; later ones are ``other``.
MAX_MODELS = 32
#: Answers for routes a client may invent (not found, not allowed, not authorized): their path
#: is not trusted as a label value.
UNTRUSTED_STATUS = frozenset({401, 403, 404, 405})

_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<uri>\S+) HTTP/[0-9.]+" (?P<status>\d{3}) (?P<ms>\d+)\s*$')
_ROUTES = (
    re.compile(r"^/(?:predictions|explanations)/(?P<model>[^/?]+)(?:/(?P<version>[^/?]+))?/?$"),
    re.compile(
        r"^/v[12]/models/(?P<model>[^/:?]+)(?:/versions/(?P<version>[^/:?]+))?"
        r"(?::predict|:explain|/infer|/explain)$"
    ),
)


@dataclass(frozen=True)
class Answer:
    """One inference request from the access log."""

    model: str
    version: str
    status: int
    seconds: float
    #: The URL carries the warm-up query parameter (see :mod:`rtserve.server.warmup`).
    warmup: bool = False

    @property
    def status_class(self) -> str:
        return f"{self.status // 100}xx"


def parse_line(line: str) -> Answer | None:
    """The inference request an access-log line records (None for other lines and routes)."""
    m = _LINE.search(line)
    if m is None or m.group("method") != "POST":
        return None
    route = _route(m.group("uri"))
    if route is None:
        return None
    status = int(m.group("status"))
    model, version = ("", "") if status in UNTRUSTED_STATUS else route
    return Answer(model, version, status, int(m.group("ms")) / 1000.0, _warmup(m.group("uri")))


def _warmup(uri: str) -> bool:
    """Whether a URL's query names the warm-up parameter."""
    _, mark, query = uri.partition("?")
    return bool(mark) and QUERY_PARAMETER in (p.split("=", 1)[0] for p in query.split("&"))


@functools.lru_cache(maxsize=1024)
def _route(uri: str) -> tuple[str, str] | None:
    """(model, version) of an inference route; None for any other path."""
    path = uri.split("?", 1)[0]
    for route in _ROUTES:
        r = route.match(path)
        if r is not None:
            return r.group("model"), r.group("version") or DEFAULT_VERSION
    return None


class RequestLatency:
    """The histogram, fed from the lines appended to ``access_log`` since the last :meth:`poll`.

    A custom collector rather than a ``prometheus_client.Histogram``: the log has whole
    milliseconds, so it keeps a count per (labels, millisecond) and forms the buckets when
    scraped, which makes an observation one dictionary update.

    Args:
        access_log: TorchServe's ``access_log.log`` (it may not exist yet).
        registry: where the histogram is registered.
        from_end: skip what the file already holds (an exporter restarted under a running
            server must not count old requests again).
        warmup_requests: leave out this many lines of warm-up requests (the start's warm-up).
    """

    HELP = "Inference requests from arrival at the frontend to the answer (TorchServe's access log, whole ms)"

    def __init__(
        self, access_log: Path, registry: CollectorRegistry, from_end: bool = True, warmup_requests: int = 0
    ) -> None:
        self.follower = LogFollower(access_log, from_end=from_end)
        self.warmup_left = warmup_requests
        self._counts: dict[tuple[str, str, str], dict[int, int]] = {}
        self._models: set[tuple[str, str]] = set()
        registry.register(self)

    def poll(self) -> int:
        """Count every new inference request; returns how many."""
        n = 0
        for line in self.follower.lines():
            answer = parse_line(line)
            if answer is not None and answer.warmup and self.warmup_left > 0:
                self.warmup_left -= 1
            elif answer is not None:
                counts = self._series(answer)
                ms = round(answer.seconds * 1000)
                counts[ms] = counts.get(ms, 0) + 1
                n += 1
        return n

    def _series(self, answer: Answer) -> dict[int, int]:
        model = (answer.model, answer.version)
        if model not in self._models:
            if len(self._models) >= MAX_MODELS:
                model = ("other", "other")
            else:
                self._models.add(model)
                for cls in STATUS_CLASSES:  # from zero: a model's first 5xx is a rate() > 0
                    self._counts.setdefault((*model, cls), {})
        return self._counts.setdefault((*model, answer.status_class), {})

    def collect(self):
        """The histogram family (prometheus_client's collector protocol)."""
        family = HistogramMetricFamily(METRIC, self.HELP, labels=LABELS)
        for labels, counts in self._counts.items():
            values = sorted(counts.items())
            buckets, i, below = [], 0, 0
            for bound in BUCKETS:
                while i < len(values) and values[i][0] <= bound * 1000:
                    below += values[i][1]
                    i += 1
                buckets.append((floatToGoString(bound), below))
            buckets.append(("+Inf", sum(counts.values())))
            family.add_metric(list(labels), buckets, sum(ms * n for ms, n in values) / 1000.0)
        yield family
