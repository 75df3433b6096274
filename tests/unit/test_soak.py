"""The soak's arithmetic and readers (bench/soak.py): kubectl's and the exporter's output as the
cluster prints them, the shipper's lag from histogram bucket deltas, slopes, the per-minute
aggregation, the store check, and the summary and plot of a report made of them."""

from __future__ import annotations

import json

import pytest

from bench import soak
from bench.loadgen import Record

pytestmark = pytest.mark.unit

# `kubectl top pod --containers` (kubectl 1.36, metrics-server 0.8) in the local overlay's namespace.
TOP = """\
POD                          NAME        CPU(cores)   MEMORY(bytes)
rtserve-7c9d8f6b5d-4xk2p     gateway     3m           6Mi
rtserve-7c9d8f6b5d-4xk2p     rtserve     1021m        934Mi
rtserve-7c9d8f6b5d-q8wzn     gateway     2m           5Mi
rtserve-7c9d8f6b5d-q8wzn     rtserve     987m         912Mi
rtserve-cassandra-0          cassandra   212m         1012Mi
"""

# An exporter's scrape: TorchServe's frontend metrics (its trailing commas), then the workers' and
# the shipper's (prometheus_client's multiprocess output).
METRICS = """\
# HELP ts_inference_requests_total Total number of inference requests.
# TYPE ts_inference_requests_total counter
ts_inference_requests_total{uuid="0b4b1c2e-5d1f-4f7a-a3a0-8e0c9f1d2e3a",model_name="realtime-classifier",model_version="default",} 5263.0
# HELP rtserve_records_ship_lag_seconds Seconds from a record's time to the store's acknowledgement
# TYPE rtserve_records_ship_lag_seconds histogram
rtserve_records_ship_lag_seconds_sum 829.999999999993
rtserve_records_ship_lag_seconds_bucket{le="0.01"} 0.0
rtserve_records_ship_lag_seconds_bucket{le="0.025"} 0.0
rtserve_records_ship_lag_seconds_bucket{le="0.05"} 4000.0
rtserve_records_ship_lag_seconds_bucket{le="0.1"} 4000.0
rtserve_records_ship_lag_seconds_bucket{le="0.25"} 5000.0
rtserve_records_ship_lag_seconds_bucket{le="0.5"} 5000.0
rtserve_records_ship_lag_seconds_bucket{le="1.0"} 5000.0
rtserve_records_ship_lag_seconds_bucket{le="2.5"} 5200.0
rtserve_records_ship_lag_seconds_bucket{le="5.0"} 5200.0
rtserve_records_ship_lag_seconds_bucket{le="10.0"} 5230.0
rtserve_records_ship_lag_seconds_bucket{le="30.0"} 5230.0
rtserve_records_ship_lag_seconds_bucket{le="60.0"} 5230.0
rtserve_records_ship_lag_seconds_bucket{le="300.0"} 5230.0
rtserve_records_ship_lag_seconds_bucket{le="1800.0"} 5230.0
rtserve_records_ship_lag_seconds_bucket{le="+Inf"} 5230.0
rtserve_records_ship_lag_seconds_count 5230.0
# HELP rtserve_records_shipped_total Records the store acknowledged
# TYPE rtserve_records_shipped_total counter
rtserve_records_shipped_total 5230.0
# HELP rtserve_records_written_total Records the handler wrote to its spool
# TYPE rtserve_records_written_total counter
rtserve_records_written_total{model_name="realtime-classifier",model_version="1.0"} 5251.0
rtserve_records_written_total{model_name="realtime-classifier",model_version="2.0"} 12.0
# HELP rtserve_records_dropped_total Records the handler could not keep
# TYPE rtserve_records_dropped_total counter
rtserve_records_dropped_total{model_name="realtime-classifier",model_version="1.0"} 0.0
# HELP rtserve_records_pending_bytes Bytes of the spool not shipped yet
# TYPE rtserve_records_pending_bytes gauge
rtserve_records_pending_bytes 18432.0
"""


def pod_item(
    name: str, app: str, phase: str = "Running", restarts: int = 0, reason: str = "", sidecar: bool = True
) -> dict:
    """A pod as ``kubectl get pods -o json`` lists it (the server's gateway: a native sidecar)."""
    main = "rtserve" if app == "rtserve" else "cassandra"
    status = {
        "phase": phase,
        "qosClass": "Guaranteed",
        "podIP": "10.88.0.12",
        "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}],
        "containerStatuses": [
            {
                "name": main,
                "restartCount": restarts,
                "state": {"running": {}},
                "containerID": f"containerd://{'a' * 64}",
            }
        ],
    }
    if sidecar:
        status["initContainerStatuses"] = [
            {"name": "gateway", "restartCount": 0, "state": {"running": {}}, "containerID": f"containerd://{'b' * 64}"}
        ]
    if reason:
        status["reason"] = reason
        status["message"] = 'Usage of EmptyDir volume "run" exceeds the limit "1Gi". '
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-12-01T20:00:00Z",
            "labels": {"app.kubernetes.io/name": app, "pod-template-hash": "7c9d8f6b5d"},
        },
        "spec": {
            "containers": [
                {
                    "name": main,
                    "image": f"registry.example.com/ml/{app}:1.0",
                    "readinessProbe": {"periodSeconds": 5 if main == "rtserve" else 10},
                }
            ]
        },
        "status": status,
    }


PODS = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        pod_item("rtserve-7c9d8f6b5d-4xk2p", "rtserve", restarts=1),
        pod_item("rtserve-7c9d8f6b5d-zz9kq", "rtserve", phase="Failed", reason="Evicted"),
        pod_item("rtserve-cassandra-0", "rtserve-cassandra", sidecar=False),
        pod_item("rtserve-verify-1-0-x7c2m", "rtserve-verify", phase="Succeeded", sidecar=False),
    ],
}

EVENTS = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        {
            "metadata": {"uid": "e-1", "name": "rtserve-7c9d8f6b5d-zz9kq.1876a"},
            "reason": "Evicted",
            "type": "Warning",
            "lastTimestamp": "2026-12-01T20:31:02Z",
            "involvedObject": {"kind": "Pod", "name": "rtserve-7c9d8f6b5d-zz9kq"},
            "message": 'Usage of EmptyDir volume "run" exceeds the limit "1Gi". ',
        },
        {
            "metadata": {"uid": "e-0", "name": "rtserve-old.1876a"},
            "reason": "Evicted",
            "type": "Warning",
            "lastTimestamp": "2026-12-01T18:00:00Z",
            "involvedObject": {"kind": "Pod", "name": "rtserve-old"},
            "message": "The node was low on resource: memory.",
        },
    ],
}


def test_kubectl_top_is_read_per_container_in_mib():
    assert soak.parse_top(TOP) == {
        "rtserve-7c9d8f6b5d-4xk2p/gateway": 6.0,
        "rtserve-7c9d8f6b5d-4xk2p/rtserve": 934.0,
        "rtserve-7c9d8f6b5d-q8wzn/gateway": 5.0,
        "rtserve-7c9d8f6b5d-q8wzn/rtserve": 912.0,
        "rtserve-cassandra-0/cassandra": 1012.0,
    }
    assert soak.parse_top("POD NAME CPU(cores) MEMORY(bytes)\np c 1m 2048Ki\np d 1m 1Gi\n") == {
        "p/c": 2.0,
        "p/d": 1024.0,
    }
    with pytest.raises(ValueError, match="no POD, NAME and MEMORY columns"):
        soak.parse_top("NAME CPU(cores) MEMORY(bytes)\nrtserve-x 3m 6Mi\n")
    with pytest.raises(ValueError, match="no memory quantity in 'p c 1m <unknown>'"):
        soak.parse_top("POD NAME CPU(cores) MEMORY(bytes)\np c 1m <unknown>\n")


def test_pods_keep_their_app_phase_eviction_and_restarts_but_not_finished_jobs():
    pods = soak.parse_pods(PODS)
    assert [p.json for p in pods] == [
        {
            "name": "rtserve-7c9d8f6b5d-4xk2p",
            "app": "rtserve",
            "phase": "Running",
            "reason": "",
            "restarts": {"gateway": 0, "rtserve": 1},
            "probe_period": 5,
        },
        {
            "name": "rtserve-7c9d8f6b5d-zz9kq",
            "app": "rtserve",
            "phase": "Failed",
            "reason": "Evicted",
            "restarts": {"gateway": 0, "rtserve": 0},
            "probe_period": 5,
        },
        {
            "name": "rtserve-cassandra-0",
            "app": "rtserve-cassandra",
            "phase": "Running",
            "reason": "",
            "restarts": {"cassandra": 0},
            "probe_period": None,
        },
    ]
    assert soak.parse_evictions(EVENTS)[0] == {
        "uid": "e-1",
        "pod": "rtserve-7c9d8f6b5d-zz9kq",
        "time": "2026-12-01T20:31:02Z",
        "message": 'Usage of EmptyDir volume "run" exceeds the limit "1Gi". ',
    }


def test_the_records_metrics_are_summed_over_labels_and_the_lag_buckets_kept():
    found = soak.parse_metrics(METRICS)
    assert {k: found[k] for k in ("written", "dropped", "shipped", "pending_bytes")} == {
        "written": 5263.0,
        "dropped": 0.0,
        "shipped": 5230.0,
        "pending_bytes": 18432.0,
    }
    assert found["lag"]["0.05"] == 4000.0 and found["lag"]["+Inf"] == 5230.0 and len(found["lag"]) == 15
    # a pod whose server keeps no records: no figure, not a zero
    assert soak.parse_metrics(METRICS.split("# HELP rtserve_records_ship")[0]) == {
        "written": None,
        "dropped": None,
        "shipped": None,
        "pending_bytes": None,
        "lag": {},
    }
    size, metrics = soak.parse_pod_sample("3481602\t/home/model-server/run\n" + METRICS)
    assert size == 3481602 and metrics == found
    assert soak.parse_pod_sample(METRICS) == (None, found)


def test_lag_quantiles_come_from_the_bucket_deltas_of_an_interval():
    before = soak.parse_metrics(METRICS)["lag"]
    after = dict(before)
    for le in ("0.1", "0.25", "0.5", "1.0"):  # 100 records shipped within 0.05-0.1 s
        after[le] += 100
    for le in ("2.5", "5.0", "10.0", "30.0", "60.0", "300.0", "1800.0", "+Inf"):  # 100 within 1-2.5 s
        after[le] += 200
    delta = soak.bucket_delta(before, after)
    assert delta["0.05"] == 0 and delta["0.1"] == 100 and delta["+Inf"] == 200
    assert soak.histogram_quantile(0.25, delta) == pytest.approx(0.075)
    assert soak.histogram_quantile(0.5, delta) == pytest.approx(0.1)
    assert soak.histogram_quantile(0.99, delta) == pytest.approx(1.0 + 1.5 * 98 / 100)
    # the whole history says otherwise: most records shipped within 0.025-0.05 s
    assert soak.histogram_quantile(0.5, after) == pytest.approx(0.025 + 0.025 * (2715 / 4000))
    # a reset (the pod's exporter restarted): the new reading whole
    assert soak.bucket_delta(after, before) == before
    assert soak.histogram_quantile(0.5, {"1.0": 0, "+Inf": 0}) is None
    assert soak.histogram_quantile(0.5, {"1.0": 0, "10.0": 0, "+Inf": 4}) == 10.0  # past the last bound


def test_the_slope_is_least_squares_per_hour():
    line = [(t, 100 + 0.5 * t / 60) for t in range(0, 3601, 30)]  # 0.5 MiB a minute
    assert soak.slope_per_hour(line) == pytest.approx(30.0)
    noisy = [(t, y + (3 if i % 2 else -3)) for i, (t, y) in enumerate(line)]
    assert soak.slope_per_hour(noisy) == pytest.approx(30.0, abs=0.5)
    assert soak.slope_per_hour([(0, 5.0), (0, 7.0)]) is None
    assert soak.trend({"p": [(0, 2**20), (3600, 3 * 2**20)]}, 1 / 2**20) == {
        "p": {"max": 3.0, "slope_per_hour": 2.0, "samples": 2}
    }


def request(start: float, first: int, final: int | None = None, bad: bool = False, n: int = 0) -> Record:
    final = first if final is None else final
    return Record(
        start,
        0.002 + n * 0.001,
        final,
        "1.0" if final == 200 else None,
        "soak",
        first_status=first,
        resent=final != first,
        request_id=f"id-{n}",
        bad=bad,
    )


def test_requests_are_aggregated_by_the_minute_they_started_in():
    minutes = soak.Minutes(id_every=2)
    for n, r in enumerate(
        [
            request(1.0, 200),
            request(2.0, 400, bad=True),
            request(59.9, 503),
            request(61.0, 507, 200),
            request(70.0, 200),
            request(80.0, 200, bad=True),
        ]
    ):
        minutes(Record(**{**vars(r), "request_id": f"id-{n}", "latency": 0.002 + n * 0.001}))
    first, second = minutes.rows(90.0)
    assert first == {
        "minute": 0,
        "sent": 3,
        "answered": 2,
        "bad": 1,
        "per_second": 0.05,
        "failed_first": 1,
        "failed_first_by_status": {"503": 1},
        "resent": 0,
        "failed_after_resend": 1,
        "p50_ms": 3.0,
        "p99_ms": 4.0,
    }
    # the last minute lasted 30 s; a 200 to a bad request failed on its first try
    assert second["per_second"] == pytest.approx(3 / 30, abs=0.05) and second["answered"] == 2
    assert second["failed_first_by_status"] == {"200": 1, "507": 1} and second["resent"] == 1
    # requests that started as a 60 s load stopped count in its last minute
    (only,) = minutes.rows(60.0)
    assert (only["minute"], only["sent"], only["per_second"]) == (0, 6, 0.1)
    # every 2nd answered request, with what its client saw
    assert minutes.ids == [("id-1", 400, None), ("id-4", 200, "1.0")]
    totals = minutes.totals(90.0)
    assert (totals["sent"], totals["answered"], totals["bad"], totals["failed_first"]) == (6, 4, 2, 3)
    assert totals["versions"] == {"1.0": 3} and totals["p50_ms"] == 4.0 and totals["p99_ms"] == 7.0


def sample(
    t: float, records: dict, pods: list | None = None, memory: dict | None = None, run_bytes: dict | None = None
) -> dict:
    out = {"t": t, "records": records, "run_bytes": run_bytes or {}, "errors": []}
    if pods is not None:
        out["pods"] = pods
    if memory is not None:
        out["memory_mib"] = memory
    return out


def reading(written: float, shipped: float, lag_fast: float, lag_slow: float, pending: float = 0.0) -> dict:
    """A pod's records metrics: ``lag_fast`` records shipped within 0.1 s, ``lag_slow`` within 1-2.5 s."""
    lag = {"0.1": lag_fast, "1.0": lag_fast, "2.5": lag_fast + lag_slow, "+Inf": lag_fast + lag_slow}
    return {"written": written, "dropped": 0.0, "shipped": shipped, "pending_bytes": pending, "lag": lag}


def test_records_are_counted_per_interval_through_restarts_and_new_pods():
    samples = [
        sample(0, {"a": reading(1000, 1000, 1000, 0)}),  # baseline
        sample(30, {"a": reading(1300, 1290, 1290, 0, pending=4096)}),
        sample(60, {"a": reading(100, 90, 80, 10), "b": reading(50, 50, 50, 0)}),  # a restarted, b new
        sample(90, {"a": reading(100, 100, 90, 10), "b": reading(50, 50, 50, 0)}),
    ]
    intervals, total = soak.records_over_time(samples)
    assert [(i["t"], i["written"], i["shipped"], i["pending_bytes"]) for i in intervals] == [
        (30, 300, 290, 4096),
        (60, 150, 140, 0),
        (90, 0, 10, 0),
    ]
    assert intervals[0]["lag_p50_s"] == pytest.approx(0.05) and intervals[2]["lag_p99_s"] == pytest.approx(0.099)
    assert intervals[1]["lag_p99_s"] == pytest.approx(1.0 + 1.5 * (0.99 * 140 - 130) / 10, abs=1e-3)
    assert (total["written"], total["shipped"], total["dropped"]) == (450, 440, 0)
    # nothing counted while no pod answered the baseline
    assert soak.records_over_time([sample(0, {})] + samples)[1] == total


def test_restarts_and_evictions_count_from_the_baseline():
    pods = soak.parse_pods(PODS)
    base = [
        {**p.json, "restarts": {**p.restarts, "rtserve": 0}} if p.app == "rtserve" else p.json
        for p in pods
        if p.reason != "Evicted"
    ]
    later = [p.json for p in pods]
    samples = [sample(0, {}, pods=base), sample(30, {}), sample(60, {}, pods=later)]
    assert soak.restarts(samples) == {"rtserve-7c9d8f6b5d-4xk2p/rtserve": 1}
    events = soak.parse_evictions(EVENTS)
    assert soak.evictions(samples, events, "2026-12-01T20:00:00Z") == ["rtserve-7c9d8f6b5d-zz9kq"]
    # an eviction already there at the start is not the run's
    assert soak.evictions([sample(0, {}, pods=later)], [], "2026-12-01T20:00:00Z") == []


def test_the_readiness_probes_predictions_are_estimated_from_each_pods_time():
    """``probe ready`` asks the model for a prediction every period: records no client caused."""
    one, evicted, _ = (p.json for p in soak.parse_pods(PODS))
    new = {**one, "name": "rtserve-7c9d8f6b5d-new"}
    samples = [
        sample(0, {}, pods=[one, evicted]),
        sample(60, {}, pods=[one, new]),
        sample(180, {}),
        sample(200, {}, pods=[one, new]),
    ]
    assert soak.probe_predictions(samples) == 200 // 5 + 140 // 5  # the evicted pod never ran
    assert soak.server_pods(samples) == (1, 2)
    assert soak.probe_predictions([sample(0, {})]) == 0 and soak.server_pods([]) == (0, 0)


def test_the_store_check_tells_missing_ids_and_mismatches():
    ids = [("a", 200, "1.0"), ("b", 400, None), ("c", 200, "1.0"), ("d", 200, "1.0"), ("e", 200, "1.0")]
    lines = [
        json.dumps(x)
        for x in (["a", 200, "1.0"], ["b", 400, "1.0"], ["c", None, None], ["d", 200, "2.0"], ["e", 503, "1.0"])
    ]
    assert soak.check_sample(ids, lines) == {
        "sampled": 5,
        "found": 4,
        "missing": 1,
        "status_mismatches": 1,
        "version_mismatches": 1,
        "examples": ["c", "e: 200 answered, 503 stored", "d: 1.0 answered, 2.0 stored"],
    }


def report(samples: list[dict], minutes: soak.Minutes) -> dict:
    intervals, total = soak.records_over_time(samples)
    return {
        "started": "2026-12-01 20:00 UTC",
        "url": "http://10.96.0.20:8080/predictions/realtime-classifier",
        "minutes": 1.5,
        "rate": 250.0,
        "connections": 8,
        "bad_every": 20,
        "drain_timeout": 300.0,
        "capacity": {"seconds": 20.0, "connections": 16, "per_second": 500.2},
        "load": minutes.totals(90.0),
        "minutes_rows": minutes.rows(90.0),
        "restarts": soak.restarts(samples),
        "evictions": [],
        "server_pods": (2, 3),
        "memory_source": "working set, kubectl top pod --containers",
        "memory": soak.trend(soak.series(samples, "memory_mib")),
        "cassandra": "no rtserve-cassandra pod (the records component): Cassandra's memory not sampled",
        "disk": soak.trend(soak.series(samples, "run_bytes"), 1 / 2**20),
        "records": {
            "answered": minutes.answered,
            **{k: total[k] for k in ("written", "shipped", "dropped")},
            "probe_predictions": 36,
            "drained_s": 2.5,
            "sample": soak.check_sample(minutes.ids, []),
        },
        "lag": {"p50_s": total["lag_p50_s"], "p99_s": total["lag_p99_s"], "intervals": intervals},
        "samples": samples,
    }


def test_the_summary_and_the_plot_show_the_run(tmp_path):
    minutes = soak.Minutes(id_every=1)
    for n in range(6):
        minutes(request(n * 15.0, 200, n=n))
    mem = lambda x: {"rtserve-a/rtserve": 900.0 + x, "rtserve-a/gateway": 6.0}  # noqa: E731
    samples = [
        sample(0, {"a": reading(0, 0, 0, 0)}, pods=[], memory=mem(0), run_bytes={"rtserve-a": 2**20}),
        sample(45, {"a": reading(3, 2, 2, 0)}, pods=[], memory=mem(3), run_bytes={"rtserve-a": 2**21}),
        sample(90, {"a": reading(6, 6, 5, 1)}, pods=[], memory=mem(6), run_bytes={"rtserve-a": 3 * 2**20}),
    ]
    r = report(samples, minutes)
    text = "\n".join(soak.summary(r))
    assert "rate             250 req/s (half of 500.2 measured, 16 connections, 20 s)" in text
    assert "6 sent, 6 answered (0 bad, expected 400); failed on the first try: 0" in text
    assert "rtserve-a/rtserve" in text and "max    906.0 MiB  slope  +240.00 MiB/h" in text
    assert "rtserve-a" in text and "max     3.00 MiB  slope   +80.00 MiB/h" in text
    assert "server pods      2 at the start, 3 at the end" in text
    assert "answered 6, written 6 (+0; the readiness probes' predictions: about 36), shipped 6, dropped 0" in text
    assert "0 of 6 sampled found, 6 missing" in text
    assert "p50 0.06 s, p99 2.41 s over the run; nothing pending 2.5 s after the load" in text
    assert not soak.ok(r)  # the sampled ids were not found
    png = tmp_path / "soak.png"
    soak.plot(r, [png, tmp_path / "docs" / "soak.png"])
    for path in (png, tmp_path / "docs" / "soak.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
