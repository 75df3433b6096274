"""rtserve_request_duration_seconds from TorchServe's access log (rtserve.observability.request_latency)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from rtserve.observability.request_latency import BUCKETS, MAX_MODELS, METRIC, RequestLatency, parse_line

pytestmark = pytest.mark.unit

STAMP = "2026-11-30T04:54:27,940 - /127.0.0.1:56108 "


@pytest.mark.parametrize(
    "request_line,expected",
    [
        ('"POST /predictions/m HTTP/1.1" 200 7', ("m", "default", "2xx", 0.007)),
        ('"POST /predictions/m/1.0 HTTP/1.1" 200 17', ("m", "1.0", "2xx", 0.017)),
        ('"POST /predictions/m?x=1 HTTP/1.1" 503 0', ("m", "default", "5xx", 0.0)),
        ('"POST /explanations/m HTTP/1.1" 200 40', ("m", "default", "2xx", 0.04)),
        ('"POST /v2/models/m/infer HTTP/1.1" 400 1', ("m", "default", "4xx", 0.001)),
        ('"POST /v2/models/m/versions/2.0/infer HTTP/1.1" 200 3', ("m", "2.0", "2xx", 0.003)),
        ('"POST /v1/models/m:predict HTTP/1.1" 200 2', ("m", "default", "2xx", 0.002)),
        # invented routes: the path is not a label
        ('"POST /predictions/nope HTTP/1.1" 404 6', ("", "", "4xx", 0.006)),
        ('"POST /predictions/m HTTP/1.1" 401 0', ("", "", "4xx", 0.0)),
    ],
)
def test_inference_lines_parse(request_line, expected):
    answer = parse_line(STAMP + request_line)
    assert (answer.model, answer.version, answer.status_class, answer.seconds) == expected


@pytest.mark.parametrize(
    "request_line",
    [
        '"GET /ping HTTP/1.1" 200 0',
        '"GET /models/m HTTP/1.1" 200 1',
        '"POST /models?url=m.mar HTTP/1.1" 200 900',
        '"GET /metrics HTTP/1.1" 200 1',
        "not an access line",
    ],
)
def test_other_lines_do_not_count(request_line):
    assert parse_line(STAMP + request_line) is None


def test_bounds_sit_between_whole_milliseconds_from_sub_ms_to_seconds():
    assert BUCKETS[0] == 0.0005 and BUCKETS[-1] >= 10
    assert list(BUCKETS) == sorted(set(BUCKETS))
    assert all(round(b * 1000 % 1, 6) == 0.5 for b in BUCKETS)


def sample(registry, name, **labels):
    return registry.get_sample_value(name, labels) or 0.0


def test_tail_observes_new_lines_only_and_survives_rotation(tmp_path):
    log = tmp_path / "access_log.log"
    log.write_text(STAMP + '"POST /predictions/m HTTP/1.1" 200 3\n')  # before the exporter
    registry = CollectorRegistry()
    latency = RequestLatency(log, registry)
    assert latency.poll() == 0
    with open(log, "a") as f:
        f.write(STAMP + '"POST /predictions/m HTTP/1.1" 200 1\n')
        f.write(STAMP + '"GET /ping HTTP/1.1" 200 0\n')
        f.write(STAMP + '"POST /predictions/m HTTP/1.1" 503 0\n')
        f.write(STAMP + '"POST /predictions/m HTTP/1.1" 200 ')  # half a line: next time
    assert latency.poll() == 2
    labels = {"model_name": "m", "model_version": "default"}
    assert sample(registry, f"{METRIC}_count", **labels, status_class="2xx") == 1
    assert sample(registry, f"{METRIC}_bucket", **labels, status_class="2xx", le="0.0005") == 0
    assert sample(registry, f"{METRIC}_bucket", **labels, status_class="2xx", le="0.0015") == 1
    assert sample(registry, f"{METRIC}_bucket", **labels, status_class="5xx", le="0.0005") == 1
    assert registry.get_sample_value(f"{METRIC}_count", {**labels, "status_class": "4xx"}) == 0
    with open(log, "a") as f:
        f.write("12\n")
    assert latency.poll() == 1
    assert sample(registry, f"{METRIC}_sum", **labels, status_class="2xx") == pytest.approx(0.013)
    log.write_text(STAMP + '"POST /predictions/m HTTP/1.1" 200 2\n')  # rotated: a new, shorter file
    assert latency.poll() == 1
    assert sample(registry, f"{METRIC}_count", **labels, status_class="2xx") == 3


def test_models_beyond_the_cap_share_one_series(tmp_path):
    log = tmp_path / "access_log.log"
    registry = CollectorRegistry()
    latency = RequestLatency(log, registry)
    log.write_text("".join(STAMP + f'"POST /predictions/m{i} HTTP/1.1" 200 1\n' for i in range(MAX_MODELS + 5)))
    assert latency.poll() == MAX_MODELS + 5
    assert sample(registry, f"{METRIC}_count", model_name="other", model_version="other", status_class="2xx") == 5
    names = {s.labels["model_name"] for m in registry.collect() for s in m.samples}
    assert len(names) == MAX_MODELS + 1


def test_the_starts_warm_up_lines_are_left_out_and_no_more(tmp_path):
    """The first ``warmup_requests`` lines with the warm-up parameter are rtserve.server's own
    warm-up (left out); a client's request with the parameter after that is counted."""
    log = tmp_path / "access_log.log"
    registry = CollectorRegistry()
    latency = RequestLatency(log, registry, from_end=False, warmup_requests=3)
    warm = STAMP + '"POST /predictions/m?rtserve_warmup=1 HTTP/1.1" 200 {}\n'
    log.write_text(
        warm.format(9) * 2
        + STAMP
        + '"POST /predictions/m HTTP/1.1" 200 1\n'
        + warm.format(8)
        + warm.format(2)
        + STAMP
        + '"POST /predictions/m?x=rtserve_warmup HTTP/1.1" 200 1\n'
    )
    assert latency.poll() == 3
    labels = {"model_name": "m", "model_version": "default", "status_class": "2xx"}
    assert sample(registry, f"{METRIC}_count", **labels) == 3
    assert sample(registry, f"{METRIC}_sum", **labels) == pytest.approx(0.004)  # 1 + 2 + 1 ms
    assert parse_line(warm.format(9)).warmup and not parse_line(STAMP + '"POST /predictions/m HTTP/1.1" 200 1').warmup
